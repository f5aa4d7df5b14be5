"""The tuner's side of ``reorder``: nothing to tune but the thread count."""

from __future__ import annotations

from collections.abc import Iterator

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.reorder import ReorderSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.tuner.kinds import Strata, TunerKind, register


def _pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[ReorderSchedule]:
    yield ReorderSchedule(threads=threads)


def _tile_key(s: ReorderSchedule) -> tuple[object, ...]:
    return ("copy",)


def _grid(op: OpSignature, hw: HardwareSpec, threads: int | None) -> Strata:
    t = hw.cores if threads is None else max(1, min(threads, hw.cores))
    return {_tile_key(ReorderSchedule(threads=t)): [ReorderSchedule(threads=t)]}


def _neighbours(op: OpSignature, best: ReorderSchedule,
                hw: HardwareSpec) -> list[ReorderSchedule]:
    return []


KIND = register(TunerKind(name="reorder", pool=_pool, tile_key=_tile_key, grid=_grid,
                          neighbours=_neighbours))
