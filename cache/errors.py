"""Errors raised by the store and the index."""

from __future__ import annotations

from tunecache.compiler.errors import TunecacheError


class StoreError(TunecacheError):
    """The store cannot do what was asked (nothing to roll back to, bad pointer, …)."""


class SnapshotError(StoreError):
    """A published snapshot or its pointer is missing, damaged or of an unknown version."""


class StoreWarning(UserWarning):
    """The store could not be read or written; what was asked went on without it."""
