"""Serving across machines and shapes: this hardware's entry first, then its nearest neighbours'.

The exact ``hw_id`` stays the key of record: a hit there is a schedule measured on this very
spec. On an exact miss, :class:`CacheView` offers the published entry of the nearest tuned
hardware that has the op, as ranked by :func:`~tunecache.compiler.hardware.hardware_distance`
(same ISA level and vector width first, then cores, cache sizes, CPU model). Hardware whose
code this machine cannot run (another architecture, a higher ISA level) is never a
neighbour. The caller (the compile-time policy) re-fits what it is offered to the local
capacities and decides whether to use it.

When no tuned hardware has the op itself, the view offers the entry of the **nearest tuned
shape** on this hardware: an op of the same family (:func:`~tunecache.compiler.ops.shape_family`:
same kind, parameters, attributes and epilogue) whose sizes are closest (the sum of
``|log2|`` size ratios): a model compiled for sequence 128 that now runs at 64 starts from
its tuned schedules (up to :data:`MAX_SHAPE_DISTANCE` away). The caller re-fits that
schedule to the new sizes.

Several stores can back one view, searched in order at equal distance: a deploy uses its own
store, then the seed shipped with tunecache (:mod:`tunecache.datasets.seed`). Each published
hardware's spec is read from ``published/<hw_id>/HARDWARE.json`` (written by publish); a
spec that does not hash to its directory's ``hw_id`` is ignored, never trusted. Neighbour
indexes open lazily, on the first exact miss.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import NamedTuple

from tunecache.cache import paths
from tunecache.cache.errors import StoreWarning
from tunecache.cache.index import Index, IndexEntry
from tunecache.compiler.codegen import CODEGEN_VERSION
from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.hardware import HardwareSpec, nearest_hardware
from tunecache.compiler.ops import OpSignature, shape_family
from tunecache.datasets import fs
from tunecache.datasets.location import Location
from tunecache.datasets.seed import seed_location

MAX_NEIGHBOURS = 4
"""Tuned hardware consulted, nearest first, after the exact one misses."""
MAX_SHAPE_DISTANCE = 4.0
"""The farthest tuned shape offered (sum of ``|log2|`` size ratios: a sequence of 128 serves
8 to 2048); beyond it the tiler's own ranking is the better start."""


class Served(NamedTuple):
    """A published entry and where it came from: ``distance`` 0.0 is the exact hardware;
    ``shape_from`` the op text of the nearest tuned shape when the op itself had no entry
    (``shape_distance``: the sum of ``|log2|`` size ratios)."""

    entry: IndexEntry
    hw_id: str
    distance: float
    store: str
    shape_from: str | None = None
    shape_distance: float = 0.0

    @property
    def exact(self) -> bool:
        return self.distance == 0.0 and self.shape_from is None

    def provenance(self) -> dict[str, object]:
        """What ``compile --json`` reports about where the schedule came from."""
        kind = "exact" if self.exact else "nearest_shape" if self.shape_from else "nearest"
        out: dict[str, object] = {"kind": kind, "hw_id": self.hw_id,
                                  "distance": round(self.distance, 3), "store": self.store}
        if self.shape_from is not None:
            out.update(shape_from=self.shape_from,
                       shape_distance=round(self.shape_distance, 3))
        return out


def published_specs(location: Location) -> list[HardwareSpec]:
    """The specs of the hardware published in a store, each verified against its ``hw_id``."""
    specs = []
    for hw_id in fs.list_dirs(location, paths.PUBLISHED_DIR):
        try:
            data = fs.read_bytes(location, paths.hardware_path(hw_id))
            spec = HardwareSpec.from_json(data.decode()) if data is not None else None
        except (TunecacheError, OSError, ValueError, TypeError):  # JSON and decode errors
            continue
        if spec is not None and spec.hw_id == hw_id:
            specs.append(spec)
    return specs


_new_tuple = tuple.__new__


class _Source(NamedTuple):
    distance: float
    rank: int
    spec: HardwareSpec
    hw_id: str  # the spec's, computed once (a property that hashes the whole spec)
    location: Location
    label: str


class CacheView:
    """The published caches a deploy on ``hw`` may serve from, exact hardware first.

    Args:
        stores: ``(location, label)`` pairs, searched in order at equal distance.
        hw: the local hardware.
        compiler: the local compiler identity (see :class:`~tunecache.cache.index.Index`).
        neighbours: whether to offer other hardware's entries on an exact miss.
        shapes: whether to offer the nearest tuned shape's entry when no hardware has the op.
    """

    def __init__(self, stores: Sequence[tuple[Location, str]], hw: HardwareSpec,
                 compiler: str | None = None, *, neighbours: bool = True,
                 shapes: bool = True, max_neighbours: int = MAX_NEIGHBOURS,
                 codegen_version: str = CODEGEN_VERSION) -> None:
        self.hw = hw
        self.hw_id = hw.hw_id
        self.compiler = compiler
        self.codegen_version = codegen_version
        self._stores = list(stores)
        opened = [(self._open(loc, self.hw_id), label) for loc, label in self._stores]
        self._exact = [(index, label) for index, label in opened if index is not None]
        self._neighbours: list[tuple[Index | None, _Source]] | None = \
            None if neighbours else []
        self._serving: list[tuple[Index, str, float, str]] | None = None
        self._max_neighbours = max_neighbours
        self._shapes = shapes
        self._families: dict[int, dict[str, list[tuple[tuple[int, ...], str]]]] = {}

    def _open(self, location: Location, hw_id: str) -> Index | None:
        try:
            return Index(location, hw_id, self.codegen_version, self.compiler)
        except Exception as exc:  # whatever a store does, the deploy goes on
            warnings.warn(f"cache of {location.uri} for {hw_id} unavailable "
                          f"({type(exc).__name__}: {exc}); served as a miss",
                          StoreWarning, stacklevel=3)
            return None

    @property
    def exact_entries(self) -> int:
        """Entries published for exactly this hardware, over every store."""
        return sum(len(index) for index, _ in self._exact)

    def neighbours(self) -> list[tuple[str, float, str]]:
        """The tuned hardware consulted on an exact miss: ``(hw_id, distance, store)``."""
        return [(s.hw_id, s.distance, s.label) for _, s in self._neighbour_indexes()]

    def _neighbour_indexes(self) -> list[tuple[Index | None, _Source]]:
        if self._neighbours is None:
            sources = []
            for rank, (location, label) in enumerate(self._stores):
                try:
                    specs = published_specs(location)
                except Exception:  # an unreadable store has no neighbours to offer
                    specs = []
                for distance, spec in nearest_hardware(self.hw, specs):
                    hw_id = spec.hw_id
                    if hw_id != self.hw_id:
                        sources.append(_Source(distance, rank, spec, hw_id, location, label))
            sources.sort(key=lambda s: (s.distance, s.rank, s.hw_id))
            self._neighbours = [(self._open(s.location, s.hw_id), s)
                                for s in sources[: self._max_neighbours]]
        return self._neighbours

    def lookup(self, op: OpSignature) -> Served | None:
        """The exact entry for ``op``; on a miss, the nearest neighbour's, then the nearest
        tuned shape's on this hardware; else None."""
        # Tuples built by tuple.__new__ and neighbours as flat tuples: at a million entries
        # the fallback's p99 is a few microseconds, and Served's Python-level __new__ and
        # attribute reads were a tenth of it.
        text = op.text
        for index, label in self._exact:
            entry = index.lookup_text(text)
            if entry is not None:
                return _new_tuple(Served, (entry, self.hw_id, 0.0, label, None, 0.0))
        serving = self._serving
        if serving is None:
            serving = self._serving = [
                (index, source.hw_id, max(source.distance, 1e-3), source.label)
                for index, source in self._neighbour_indexes() if index is not None]
        for index, hw_id, distance, label in serving:
            entry = index.lookup_text(text)
            if entry is not None:
                return _new_tuple(Served, (entry, hw_id, distance, label, None, 0.0))
        return self._nearest_shape(op) if self._shapes else None

    def _nearest_shape(self, op: OpSignature) -> Served | None:
        split = shape_family(op.text)
        if split is None:
            return None
        family, sizes = split
        best: tuple[float, str, Index, str] | None = None
        for index, label in self._exact:
            for other, text in self._family_members(index).get(family, ()):
                distance = sum(abs(math.log2(a / b)) for a, b in zip(sizes, other, strict=True))
                if distance <= MAX_SHAPE_DISTANCE and (best is None or distance < best[0]):
                    best = (distance, text, index, label)
        if best is None:
            return None
        entry = best[2].lookup_text(best[1])
        if entry is None:
            return None
        return Served(entry, self.hw_id, 0.0, best[3], best[1], best[0])

    def _family_members(self, index: Index) -> dict[str, list[tuple[tuple[int, ...], str]]]:
        """``index``'s op texts grouped by family (built on the first shape miss)."""
        members = self._families.get(id(index))
        if members is None:
            members = {}
            for text in index.ops():
                split = shape_family(text)
                if split is not None:
                    members.setdefault(split[0], []).append((split[1], text))
            self._families[id(index)] = members
        return members

    def spec_of(self, hw_id: str) -> HardwareSpec | None:
        """The spec of a neighbour this view has consulted."""
        if hw_id == self.hw_id:
            return self.hw
        return next((s.spec for _, s in self._neighbour_indexes() if s.hw_id == hw_id),
                    None)


def serving_view(location: Location, hw: HardwareSpec, compiler: str | None = None, *,
                 neighbours: bool = True) -> CacheView:
    """The view a compile or a tuning job on ``hw`` reads: the store at ``location``, then
    the seed (:func:`~tunecache.datasets.seed.seed_location`) unless it is off or the same."""
    stores = [(location, "store")]
    seed = seed_location()
    if seed is not None and seed.uri != location.uri:
        stores.append((seed, "seed"))
    return CacheView(stores, hw, compiler, neighbours=neighbours)
