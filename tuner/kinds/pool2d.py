"""The tuner's side of ``pool2d``: output tiles of one to four vectors, vectors per step,
row blocks and streaming stores (global pooling and blocked layouts: vectors or pixels per
step and unrolling only)."""

from __future__ import annotations

from collections.abc import Iterator

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.pool2d import (
    OW_VECTORS,
    ROWS_CHOICES,
    UNROLL_CHOICES,
    VEC_CHOICES,
    Pool2dSchedule,
    is_blocked,
    is_global,
)
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import problems
from tunecache.tuner.kinds import Strata, TunerKind, register


def _schedules(op: OpSignature, hw: HardwareSpec, threads: int, unrolls: tuple[int, ...],
               nts: tuple[int, ...]) -> Iterator[Pool2dSchedule]:
    if is_global(op) or is_blocked(op):
        for vec in VEC_CHOICES:
            for unroll in unrolls:
                yield Pool2dSchedule(ow_block=hw.lanes, vec=vec, unroll=unroll, threads=threads)
        return
    for nv in OW_VECTORS:
        for vec in VEC_CHOICES:
            for rows in ROWS_CHOICES:
                for unroll in unrolls:
                    for nt in nts:
                        yield Pool2dSchedule(ow_block=nv * hw.lanes, vec=vec, unroll=unroll,
                                             rows=rows, nt=nt, threads=threads)


def _pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[Pool2dSchedule]:
    return _schedules(op, hw, threads, (1,), (0,))


def _tile_key(s: Pool2dSchedule) -> tuple[object, ...]:
    return (s.ow_block, s.rows)


def _grid(op: OpSignature, hw: HardwareSpec, threads: int | None) -> Strata:
    t = hw.cores if threads is None else max(1, min(threads, hw.cores))
    strata: Strata = {}
    for s in _schedules(op, hw, t, UNROLL_CHOICES, (0, 1)):
        if not problems(op, s, hw):
            strata.setdefault(_tile_key(s), []).append(s)
    return strata


def _neighbours(op: OpSignature, best: Pool2dSchedule, hw: HardwareSpec) -> list[Pool2dSchedule]:
    out = [best.replace(vec=v) for v in VEC_CHOICES if v != best.vec]
    out += [best.replace(rows=r) for r in ROWS_CHOICES if r != best.rows]
    out += [best.replace(ow_block=nv * hw.lanes) for nv in OW_VECTORS
            if nv * hw.lanes != best.ow_block]
    out += [best.replace(unroll=u) for u in UNROLL_CHOICES if u != best.unroll]
    return [*out, best.replace(nt=1 - best.nt)]


KIND = register(TunerKind(name="pool2d", pool=_pool, tile_key=_tile_key, grid=_grid,
                          neighbours=_neighbours))
