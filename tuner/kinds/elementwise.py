"""The tuner's side of ``elementwise``: vectors per step, unrolling and streaming stores."""

from __future__ import annotations

from collections.abc import Iterator

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.elementwise import (
    UNROLL_CHOICES,
    VEC_CHOICES,
    ElementwiseSchedule,
)
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import problems
from tunecache.tuner.kinds import Strata, TunerKind, register


def _pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[ElementwiseSchedule]:
    for vec in VEC_CHOICES:
        for unroll in (1, 2):
            for nt in (0, 1):
                yield ElementwiseSchedule(vec=vec, unroll=unroll, nt=nt, threads=threads)


def _tile_key(s: ElementwiseSchedule) -> tuple[object, ...]:
    return (s.vec, s.nt)


def _grid(op: OpSignature, hw: HardwareSpec, threads: int | None) -> Strata:
    t = hw.cores if threads is None else max(1, min(threads, hw.cores))
    strata: Strata = {}
    for vec in VEC_CHOICES:
        for unroll in UNROLL_CHOICES:
            for nt in (0, 1):
                s = ElementwiseSchedule(vec=vec, unroll=unroll, nt=nt, threads=t)
                if not problems(op, s, hw):
                    strata.setdefault(_tile_key(s), []).append(s)
    return strata


def _neighbours(op: OpSignature, best: ElementwiseSchedule,
                hw: HardwareSpec) -> list[ElementwiseSchedule]:
    out = [best.replace(vec=v) for v in VEC_CHOICES if v != best.vec]
    out += [best.replace(unroll=u) for u in UNROLL_CHOICES if u != best.unroll]
    return [*out, best.replace(nt=1 - best.nt)]


KIND = register(TunerKind(name="elementwise", pool=_pool, tile_key=_tile_key, grid=_grid,
                          neighbours=_neighbours))
