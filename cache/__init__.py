"""tunecache.cache: the store (records, published snapshots) and deploy-time lookups."""

from __future__ import annotations

from tunecache.cache.errors import SnapshotError, StoreError
from tunecache.cache.index import Index, IndexEntry, SnapshotWarning
from tunecache.cache.publish import best_of
from tunecache.cache.store import CompactResult, Pointer, PublishResult, Store, VerifyReport

__all__ = [
    "CompactResult",
    "Index",
    "IndexEntry",
    "Pointer",
    "PublishResult",
    "SnapshotError",
    "SnapshotWarning",
    "Store",
    "StoreError",
    "VerifyReport",
    "best_of",
]
