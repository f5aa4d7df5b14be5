"""The tuner's side of ``lrn``: pixels per tile (the layout's choices) and vectors per
step; the space is small enough to be the pool."""

from __future__ import annotations

from collections.abc import Iterator

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.lrn import (
    BLOCKED_PIXELS,
    PLAIN_PIXELS,
    VEC_CHOICES,
    LrnSchedule,
    is_blocked,
)
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import problems
from tunecache.tuner.kinds import Strata, TunerKind, register


def _pixels(op: OpSignature) -> tuple[int, ...]:
    return BLOCKED_PIXELS if is_blocked(op) else PLAIN_PIXELS


def _pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[LrnSchedule]:
    for pixels in _pixels(op):
        for vec in VEC_CHOICES:
            yield LrnSchedule(pixels=pixels, vec=vec, threads=threads)


def _tile_key(s: LrnSchedule) -> tuple[object, ...]:
    return (s.pixels,)


def _grid(op: OpSignature, hw: HardwareSpec, threads: int | None) -> Strata:
    t = hw.cores if threads is None else max(1, min(threads, hw.cores))
    strata: Strata = {}
    for s in _pool(op, hw, t):
        if not problems(op, s, hw):
            strata.setdefault(_tile_key(s), []).append(s)
    return strata


def _neighbours(op: OpSignature, best: LrnSchedule, hw: HardwareSpec) -> list[LrnSchedule]:
    out = [best.replace(vec=v) for v in VEC_CHOICES if v != best.vec]
    return out + [best.replace(pixels=p) for p in _pixels(op) if p != best.pixels]


KIND = register(TunerKind(name="lrn", pool=_pool, tile_key=_tile_key, grid=_grid,
                          neighbours=_neighbours))
