"""What the build cache holds, and pruning it (``tunecache build-cache``).

The build cache only grows: every schedule a tuning job measures leaves a shared object, its
C source and its digest record (``<root>/<key[:2]>/<key>.{so,c,json}``), and every compiler
flag set a precompiled header (``<root>/pch/<key>/``, about 25 MB). Anything in it can be
deleted: a missing kernel or header is built again on its next use. Pruning goes by build
time (the shared object's or header's mtime), oldest first. A kernel's record is removed
before its object, under the key folder's lock that publication takes, so a reader sees
either a verified pair or none; a process that already holds the object open keeps it.
Temporary files of builds that died (``.<key>.*.tmp``) older than an hour go too.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from tunecache.compiler.backends.cpu.pch import HEADER_NAME
from tunecache.compiler.files import RECORD_SUFFIX, folder_lock

STRAY_AGE_S = 3600.0
"""A temporary file this much older than now belongs to a build that is not running."""


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One removable unit: a kernel (object, source, record) or a precompiled header."""

    kind: str
    """``kernel``, ``header`` or ``stray`` (a dead build's temporary file)."""
    key: str
    paths: tuple[Path, ...]
    """Removed in this order (a kernel's record first)."""
    bytes: int
    built: float
    """Epoch seconds the object was written."""


@dataclass(frozen=True, slots=True)
class CacheSummary:
    """Counts and bytes per kind of entry, and the build times of the oldest and newest."""

    root: Path
    counts: dict[str, int]
    bytes: dict[str, int]
    oldest: float | None
    newest: float | None

    def to_dict(self) -> dict[str, object]:
        """JSON-ready; build times as ISO 8601 UTC."""
        return {"root": str(self.root), "entries": self.counts, "bytes": self.bytes,
                "total_bytes": sum(self.bytes.values()), "oldest": _iso(self.oldest),
                "newest": _iso(self.newest)}


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, timezone.utc).isoformat()


def entries(root: Path, now: float | None = None) -> list[CacheEntry]:
    """Every kernel, precompiled header and stray temporary file under ``root``, oldest
    first (temporary files younger than :data:`STRAY_AGE_S` are in use and left out)."""
    now = time.time() if now is None else now
    found = [*_kernels(root), *_headers(root / "pch"), *_strays(root, now)]
    return sorted(found, key=lambda e: (e.built, e.key))


def summary(root: Path, now: float | None = None) -> CacheSummary:
    """What :func:`entries` finds, summed per kind."""
    found = entries(root, now)
    counts: dict[str, int] = {"kernel": 0, "header": 0, "stray": 0}
    sizes = dict.fromkeys(counts, 0)
    for entry in found:
        counts[entry.kind] += 1
        sizes[entry.kind] += entry.bytes
    built = [e.built for e in found if e.kind != "stray"]
    return CacheSummary(root, counts, sizes, min(built, default=None), max(built, default=None))


def prunable(found: list[CacheEntry], now: float, keep_s: float | None = None,
             max_bytes: int | None = None) -> list[CacheEntry]:
    """Of ``found`` (oldest first): strays, entries built more than ``keep_s`` ago, then the
    oldest of the rest until what stays fits in ``max_bytes``."""
    doomed = [e for e in found if e.kind == "stray"
              or (keep_s is not None and now - e.built > keep_s)]
    if max_bytes is not None:
        left = sum(e.bytes for e in found) - sum(e.bytes for e in doomed)
        for entry in found:
            if left <= max_bytes:
                break
            if entry not in doomed:
                doomed.append(entry)
                left -= entry.bytes
    return doomed


def remove(entry: CacheEntry) -> None:
    """Delete ``entry``'s files (a kernel's under its folder's lock); gone already is fine."""
    if entry.kind == "kernel":
        with folder_lock(entry.paths[0].parent):
            _unlink_all(entry.paths)
        return
    _unlink_all(entry.paths)
    if entry.kind == "header":
        # Something new written there meanwhile stays, with its folder.
        with contextlib.suppress(OSError):
            entry.paths[0].parent.rmdir()


def _unlink_all(paths: tuple[Path, ...]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _kernels(root: Path) -> Iterator[CacheEntry]:
    for folder in _key_folders(root):
        for obj in folder.glob("*.so"):
            key = obj.stem
            paths = (folder / f"{key}{RECORD_SUFFIX}", obj, folder / f"{key}.c")
            built = _mtime(obj)
            if built is not None:
                yield CacheEntry("kernel", key, paths, _bytes(paths), built)


def _headers(pch: Path) -> Iterator[CacheEntry]:
    for folder in _subfolders(pch):
        gch = folder / f"{HEADER_NAME}.gch"
        paths = (gch.with_name(HEADER_NAME + RECORD_SUFFIX), gch, folder / HEADER_NAME)
        built = _mtime(gch) or _mtime(folder / HEADER_NAME) or _mtime(folder)
        if built is not None:
            yield CacheEntry("header", folder.name, paths, _bytes(paths), built)


def _strays(root: Path, now: float) -> Iterator[CacheEntry]:
    for folder in [*_key_folders(root), *_subfolders(root / "pch")]:
        for tmp in folder.glob(".*.tmp"):
            built = _mtime(tmp)
            if built is not None and now - built > STRAY_AGE_S:
                yield CacheEntry("stray", tmp.name, (tmp,), _bytes((tmp,)), built)


def _key_folders(root: Path) -> list[Path]:
    return [f for f in _subfolders(root) if len(f.name) == 2]


def _subfolders(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError:
        return []


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _bytes(paths: tuple[Path, ...]) -> int:
    total = 0
    for path in paths:
        with contextlib.suppress(OSError):
            total += os.stat(path).st_size
    return total
