"""The tuner's side of ``rotary``: vectors per step and unrolling (every point of the grid is
small: illegal ones, wider than half a row, are dropped by the legality check)."""

from __future__ import annotations

from collections.abc import Iterator

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.rotary import ROTARY_UNROLLS, ROTARY_VECS, RotarySchedule
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import problems
from tunecache.tuner.kinds import Strata, TunerKind, register


def _pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[RotarySchedule]:
    for vec in ROTARY_VECS:
        for unroll in (1, 2):
            yield RotarySchedule(vec=vec, unroll=unroll, threads=threads)


def _tile_key(s: RotarySchedule) -> tuple[object, ...]:
    return (s.vec,)


def _grid(op: OpSignature, hw: HardwareSpec, threads: int | None) -> Strata:
    t = hw.cores if threads is None else max(1, min(threads, hw.cores))
    strata: Strata = {}
    for vec in ROTARY_VECS:
        for unroll in ROTARY_UNROLLS:
            s = RotarySchedule(vec=vec, unroll=unroll, threads=t)
            if not problems(op, s, hw):
                strata.setdefault(_tile_key(s), []).append(s)
    return strata


def _neighbours(op: OpSignature, best: RotarySchedule, hw: HardwareSpec) -> list[RotarySchedule]:
    out = [best.replace(vec=v) for v in ROTARY_VECS if v != best.vec]
    return out + [best.replace(unroll=u) for u in ROTARY_UNROLLS if u != best.unroll]


KIND = register(TunerKind(name="rotary", pool=_pool, tile_key=_tile_key, grid=_grid,
                          neighbours=_neighbours))
