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

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.kinds import ENTRY_POINT_GROUP, kind_names

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


_KINDS: dict[str, CostKind] = {}


def register(kind: CostKind) -> CostKind:
    """Add ``kind`` to the registry (a kind module calls this when imported)."""
    _KINDS[kind.name] = kind
    return kind


def _import(name: str) -> None:
    try:
        importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise


def cost_kind(name: str) -> CostKind:
    """The cost-model side of kind ``name``."""
    kind = _KINDS.get(name)
    if kind is None:
        _load()
        _import(name)  # a kind registered after the first load
        kind = _KINDS.get(name)
    if kind is None:
        raise OpSignatureError(f"the cost model has no module for op kind {name!r} "
                               f"(costmodel/kinds/{name}.py)")
    return kind


def all_cost_kinds() -> tuple[CostKind, ...]:
    """The cost-model side of every registered op kind that has one, in registry order."""
    _load()
    return tuple(_KINDS[name] for name in kind_names() if name in _KINDS)


_loaded = False


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for point in entry_points(group=ENTRY_POINT_GROUP + ".costmodel"):
        importlib.import_module(point.value)
    for name in kind_names():
        if name not in _KINDS:
            _import(name)
