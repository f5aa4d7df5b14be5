"""Path parts of the records layout, and the check every such part must pass.

Anything that becomes part of a store path (``hw_id``, ``op_kind``, snapshot names, …) comes
from data that may be hostile, so it must match a restricted character set: letters, digits,
``_``, ``-`` and ``.``, starting with a letter or digit, no ``..``, at most 128 characters.
That excludes separators, ``=`` (hive syntax), hidden names and traversal.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timezone

from tunecache.datasets.errors import PathPartError

RECORDS_DIR = "records"
FRAGMENT_SUFFIX = ".parquet"
MAX_PART_LENGTH = 128

_PART_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_FRAGMENT_RE = re.compile(r"part-[0-9]{8}T[0-9]{12}Z-[0-9a-f]{32}\.parquet")


def check_part(what: str, value: object) -> str:
    """Return ``value`` if it is safe as one path component, else raise PathPartError."""
    if not isinstance(value, str):
        raise PathPartError(f"{what} must be a string, got {type(value).__name__}")
    if (
        not value
        or len(value) > MAX_PART_LENGTH
        or ".." in value
        or _PART_RE.fullmatch(value) is None
    ):
        raise PathPartError(
            f"{what} {value!r} is not usable as a store path part: use 1..{MAX_PART_LENGTH} "
            "letters, digits, '_', '-' or '.', starting with a letter or digit, without '..'"
        )
    return value


def partition_dir(hw_id: str, op_kind: str) -> str:
    """``records/hw_id=…/op_kind=…`` relative to the store root (both parts checked)."""
    return (
        f"{RECORDS_DIR}/hw_id={check_part('hw_id', hw_id)}/"
        f"op_kind={check_part('op_kind', op_kind)}"
    )


def new_fragment_name(now: datetime | None = None) -> str:
    """A unique fragment file name, sortable by creation time."""
    now = now or datetime.now(timezone.utc)
    return f"part-{now:%Y%m%dT%H%M%S%f}Z-{uuid.uuid4().hex}{FRAGMENT_SUFFIX}"


def is_fragment_name(name: str) -> bool:
    """Whether ``name`` is a fragment file name this library wrote (not hidden, not temp)."""
    return _FRAGMENT_RE.fullmatch(name) is not None


def parse_partition(relative_dir: str) -> tuple[str, str] | None:
    """``(hw_id, op_kind)`` from ``hw_id=…/op_kind=…`` (relative to records/), or None."""
    parts = relative_dir.strip("/").split("/")
    if len(parts) != 2:
        return None
    hw, kind = parts
    if not hw.startswith("hw_id=") or not kind.startswith("op_kind="):
        return None
    hw_id, op_kind = hw[len("hw_id="):], kind[len("op_kind="):]
    try:
        check_part("hw_id", hw_id)
        check_part("op_kind", op_kind)
    except PathPartError:
        return None
    return hw_id, op_kind
