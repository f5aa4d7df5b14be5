"""The op-kind registry of the tuner layer: each kind's candidate pool, grid and refinement.

Each kind has a module here (``tuner/kinds/<name>.py``) that registers one
:class:`TunerKind` when imported. The tiler (:mod:`tunecache.tuner.search.roller`) ranks any kind's
pool by the analytic estimate and keeps a diverse top-k; the search
(:mod:`tunecache.tuner.search.tune`) refines the best measured schedule through its neighbours.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunecache.compiler.kinds.layers import LayerRegistry
from tunecache.costmodel.analytic import ceil_div, round_up

if TYPE_CHECKING:
    from tunecache.compiler.hardware import HardwareSpec
    from tunecache.compiler.ops import OpSignature
    from tunecache.compiler.schedule import Schedule

Strata = dict[tuple[object, ...], list[Any]]
"""A schedule grid grouped by register tile (or another diversity key)."""


@dataclass(frozen=True)
class TunerKind:
    """What the tuner knows about one op kind.

    * ``pool(op, hw, threads)`` — the tiler's hardware-aligned candidates for one thread
      count (illegal ones are dropped by the caller; duplicates too).
    * ``tile_key(schedule)`` — what makes two candidates "the same tile": the tiler keeps a
      few per key so one wrong guess cannot fill the whole top-k.
    * ``grid(op, hw, threads)`` — the legal space on a grid, grouped by tile (for
      evaluation and exploration; sampled per group by :func:`roller.exhaustive_space`).
    * ``neighbours(op, best, hw)`` — schedules one step from ``best`` (legal or not; the
      caller filters) for local refinement.
    * ``algorithm(schedule)`` — which algorithm a schedule runs (Strassen or the BLIS
      kernel, Winograd or direct). The analytic estimate ranks tiles of one algorithm well
      and different algorithms poorly, so the tiler keeps each algorithm's best in its top-k
      and a tuning job measures every one of them (kinds with one algorithm leave the
      default).
    * ``in_place_weights(op, schedule, hw)`` — schedules like ``schedule`` that read its
      weights (second input) where they lie, best guess first, or none. The tiler ranks as
      if weights were packed once, as a compiled model holds them; a tuning job that times
      them packed on every call (weights that are an activation) measures these variants of
      the tiler's first candidate too (kinds without weight packing leave the default).
    * ``challengers(op, schedule, hw)`` — schedules like the tiler's first that its estimate
      ranks lower for a cost it weighs poorly on some machines; a tuning job measures them
      right after it (kinds with no such doubt leave the default).
    * ``unseen(schedule)`` — whether ``schedule`` runs an engine the learned cost model's
      features do not describe (matrix tiles): the compile-time policy ranks a miss whose
      tiler top-1 is one by the estimate, not the model, which would score it as the
      vector kernel of the same knobs (kinds with one engine leave the default).
    """

    name: str
    pool: Callable[[OpSignature, HardwareSpec, int], Iterable[Any]]
    tile_key: Callable[[Any], tuple[object, ...]]
    grid: Callable[[OpSignature, HardwareSpec, int | None], Strata]
    neighbours: Callable[[OpSignature, Any, HardwareSpec], list[Any]]
    algorithm: Callable[[Any], str] = lambda schedule: ""
    in_place_weights: Callable[[OpSignature, Any, HardwareSpec], list[Any]] = (
        lambda op, schedule, hw: [])
    challengers: Callable[[OpSignature, Any, HardwareSpec], list[Any]] = (
        lambda op, schedule, hw: [])
    unseen: Callable[[Any], bool] = lambda schedule: False


_REGISTRY: LayerRegistry[TunerKind] = LayerRegistry(__name__, "tuner", "the tiler has no model")


def register(kind: TunerKind) -> TunerKind:
    """Add ``kind`` to the registry (a kind module calls this when imported)."""
    return _REGISTRY.register(kind)


def tuner_kind(name: str) -> TunerKind:
    """The tuner side of kind ``name``."""
    return _REGISTRY.get(name)


def balanced(extent: int, block: int, align: int) -> int:
    """Padding tolerance: the smallest aligned block giving the same number of blocks."""
    block = max(align, min(block, round_up(extent, align)))
    count = ceil_div(extent, block)
    return round_up(ceil_div(extent, count), align)


def threads_axes(threads: int, axes: Iterable[str]) -> list[str]:
    """The parallel axes worth trying: the first alone at one thread, all of them otherwise."""
    axes = list(axes)
    return axes if threads > 1 else axes[:1]


def legal_neighbours(op: OpSignature, best: Schedule, hw: HardwareSpec,
                     moves: Iterable[Schedule]) -> list[Schedule]:
    """``moves`` without ``best``, duplicates and illegal schedules, in order."""
    from tunecache.compiler.schedule import problems

    seen: set[Schedule] = set()
    out: list[Schedule] = []
    for s in moves:
        if s != best and s not in seen and not problems(op, s, hw):
            seen.add(s)
            out.append(s)
    return out
