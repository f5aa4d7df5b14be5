"""tunecache.cache: the store (records, published snapshots) and deploy-time lookups."""

from __future__ import annotations

from tunecache.cache.errors import SnapshotError, StoreError, StoreWarning
from tunecache.cache.index import Index, IndexEntry, SnapshotWarning, compiler_key
from tunecache.cache.publish import Rejection, Selection, best_of, select
from tunecache.cache.store import CompactResult, Pointer, PublishResult, Store, VerifyReport

__all__ = [
    "CompactResult",
    "Index",
    "IndexEntry",
    "Pointer",
    "PublishResult",
    "Rejection",
    "Selection",
    "SnapshotError",
    "SnapshotWarning",
    "Store",
    "StoreError",
    "StoreWarning",
    "VerifyReport",
    "best_of",
    "compiler_key",
    "select",
]
