"""The registry every upper layer keeps for its side of the op kinds (the cost model's
estimate and features, the tuner's candidates): one module per kind in the layer's package,
named like the kind, imported on first use; plug-ins add theirs through an entry-point group
``tunecache.kinds.<layer>``."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Generic, Protocol, TypeVar

from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.kinds import ENTRY_POINT_GROUP, kind_names


class _Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=_Named)


class LayerRegistry(Generic[T]):
    """Kind name -> this layer's value for it, loaded from ``package.<kind>`` modules."""

    def __init__(self, package: str, layer: str, what: str) -> None:
        self._package = package
        self._layer = layer
        self._what = what
        self._items: dict[str, T] = {}
        self._loaded = False

    def register(self, item: T) -> T:
        """Add ``item`` (a kind module calls this when imported)."""
        self._items[item.name] = item
        return item

    def get(self, name: str) -> T:
        """This layer's side of kind ``name``; :class:`OpSignatureError` if it has none."""
        item = self._items.get(name)
        if item is None:
            self._load()
            self._import(name)  # a kind registered after the first load
            item = self._items.get(name)
        if item is None:
            path = self._package.removeprefix("tunecache.").replace(".", "/")
            raise OpSignatureError(f"{self._what} for op kind {name!r} ({path}/{name}.py)")
        return item

    def all(self) -> tuple[T, ...]:
        """This layer's side of every registered kind that has one, in registry order."""
        self._load()
        return tuple(self._items[name] for name in kind_names() if name in self._items)

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for point in entry_points(group=f"{ENTRY_POINT_GROUP}.{self._layer}"):
            importlib.import_module(point.value)
        for name in kind_names():
            if name not in self._items:
                self._import(name)

    def _import(self, name: str) -> None:
        module = f"{self._package}.{name}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
