"""The op-kind registry of the cost-model layer: each kind's analytic estimate and features.

Each kind has a module here (``costmodel/kinds/<name>.py``) that registers one
:class:`CostKind` when imported: its roofline-style :func:`estimate` and the
:class:`FeatureBlock` of named columns its schedule family fills in the feature vector
(:mod:`tunecache.costmodel.features` lays out the union of every registered block; a column
no block of a row's family fills is NaN). Kinds that share a schedule family share a block,
and families may fill the same column name when it means the same thing (e.g. the register
tile's ``tile_rows``), so the model learns across them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunecache.compiler.kinds.layers import LayerRegistry

if TYPE_CHECKING:
    from tunecache.compiler.hardware import HardwareSpec
    from tunecache.compiler.ops import OpSignature
    from tunecache.costmodel.analytic import Estimate

NAN = float("nan")


def l2(x: float) -> float:
    """``log2(1 + x)`` (NaN for negative x): sizes as ratios, not absolute values."""
    return math.log2(1.0 + x) if x >= 0 else NAN


@dataclass(frozen=True)
class FeatureBlock:
    """The feature columns one schedule family fills, in three parts: the op (its dims and
    attributes), the knobs (of the schedule alone), and the cross terms of op, schedule and
    hardware (register tile, edge waste, blocking, footprints, bytes per level, balance).
    Each ``*_values`` returns one float per name, in order."""

    op_names: tuple[str, ...]
    op_values: Callable[[OpSignature], tuple[float, ...]]
    knob_names: tuple[str, ...]
    knob_values: Callable[[Any, HardwareSpec], tuple[float, ...]]
    cross_names: tuple[str, ...]
    cross_values: Callable[[OpSignature, Any, HardwareSpec], tuple[float, ...]]


@dataclass(frozen=True)
class CostKind:
    """What the cost model knows about one op kind: its estimate and its features."""

    name: str
    estimate: Callable[[OpSignature, Any, HardwareSpec], Estimate]
    features: FeatureBlock


_REGISTRY: LayerRegistry[CostKind] = LayerRegistry(__name__, "costmodel",
                                                  "the cost model has no module")


def register(kind: CostKind) -> CostKind:
    """Add ``kind`` to the registry (a kind module calls this when imported)."""
    return _REGISTRY.register(kind)


def cost_kind(name: str) -> CostKind:
    """The cost-model side of kind ``name``."""
    return _REGISTRY.get(name)


def all_cost_kinds() -> tuple[CostKind, ...]:
    """The cost-model side of every registered op kind that has one, in registry order."""
    return _REGISTRY.all()
