"""Layout of the published part of a store:
``published/<hw_id>/{CURRENT,HARDWARE.json,snapshot-*.parquet}``.

Snapshot names are sortable by creation time and end with a digest of their content; the
``CURRENT`` pointer names one of them. Every name read back from a store is checked against
the pattern before it is used as a path.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from tunecache.cache.errors import SnapshotError
from tunecache.datasets.paths import check_part

PUBLISHED_DIR = "published"
POINTER_NAME = "CURRENT"
HARDWARE_NAME = "HARDWARE.json"
SNAPSHOT_RE = re.compile(r"snapshot-([0-9]{8}T[0-9]{12}Z)-([0-9a-f]{16})\.parquet")


def published_dir(hw_id: str) -> str:
    return f"{PUBLISHED_DIR}/{check_part('hw_id', hw_id)}"


def pointer_path(hw_id: str) -> str:
    return f"{published_dir(hw_id)}/{POINTER_NAME}"


def hardware_path(hw_id: str) -> str:
    """The spec of a published hardware, for finding the nearest one (its content hashes to
    ``hw_id``; a file that does not is ignored)."""
    return f"{published_dir(hw_id)}/{HARDWARE_NAME}"


def check_snapshot_name(name: object) -> str:
    """Return ``name`` if it is a well-formed snapshot file name, else raise SnapshotError."""
    if not isinstance(name, str) or SNAPSHOT_RE.fullmatch(name) is None:
        raise SnapshotError(f"{name!r} is not a snapshot name (snapshot-<time>-<digest>.parquet)")
    return name


def snapshot_path(hw_id: str, name: str) -> str:
    return f"{published_dir(hw_id)}/{check_snapshot_name(name)}"


def new_snapshot_name(digest: str, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return check_snapshot_name(f"snapshot-{now:%Y%m%dT%H%M%S%f}Z-{digest[:16]}.parquet")


def snapshot_digest_of(name: str) -> str:
    match = SNAPSHOT_RE.fullmatch(name)
    return match.group(2) if match else ""
