"""Values computed from objects, remembered while those objects live.

Weight slices a lowering derives and weights packed into a kernel's layout depend only on
constant arrays that a model keeps for its whole life: the same model planned at another
input shape should reuse them, not compute them again. :class:`IdentityMemo` keys a value
by the identity of the arrays it came from (plus what was done to them), checks that
identity on every hit (an id may be reused once an object is gone), and forgets the value
when any of those arrays is collected.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from functools import partial
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class IdentityMemo(Generic[V]):
    """``(sources, key) -> value``, computed once while every source lives."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[tuple[weakref.ref[Any], ...], V]] = {}
        # Re-entered by _forget when a collection runs inside get().
        self._lock = threading.RLock()

    def get(self, sources: tuple[Any, ...], key: Hashable, make: Callable[[], V]) -> V:
        """The value made from ``sources`` by the operation ``key`` names: remembered, or
        ``make()`` now (and remembered until a source is collected)."""
        full = (tuple(id(s) for s in sources), key)
        with self._lock:
            found = self._entries.get(full)
            if found is not None and all(r() is s for r, s in zip(found[0], sources,
                                                                  strict=True)):
                return found[1]
            value = make()
            forget = partial(self._forget, full)
            refs = tuple(weakref.ref(s, forget) for s in sources)
            self._entries[full] = (refs, value)
            return value

    def __len__(self) -> int:
        return len(self._entries)

    def _forget(self, full: Hashable, _dead: object = None) -> None:
        with self._lock:
            self._entries.pop(full, None)
