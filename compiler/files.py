"""Files published atomically into a shared cache folder: written under a temporary name,
on disk (fsync) before an atomic rename, under the folder's advisory lock where a pair of
files must change together; and the digest record beside a published file (its SHA-256 and
size, written before the file is renamed into place) that a reader checks it against."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

RECORD_SUFFIX = ".json"
RECORD_MAX_BYTES = 4096


class UnreadableFile(OSError):
    """A file tunecache refuses to read: not a regular file, or larger than its limit."""


def open_regular(path: str | os.PathLike[str], *, follow_links: bool = False) -> int:
    """A read-only descriptor of the regular file ``path``: never blocks (a FIFO planted in a
    shared folder would hang an ``open`` for reading until a writer came), and follows a
    symbolic link in its last component only with ``follow_links`` (a file a user named);
    :class:`UnreadableFile` naming the path for anything but a regular file."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnreadableFile(errno.EINVAL, "is not a regular file", str(path))
    return fd


def read_regular(path: str | os.PathLike[str], limit: int, *,
                 follow_links: bool = False) -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_regular`), at most ``limit``:
    :class:`UnreadableFile` for a larger one, never reading more than ``limit + 1``."""
    with os.fdopen(open_regular(path, follow_links=follow_links), "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise UnreadableFile(errno.EFBIG, f"is larger than {_size_text(limit)}", str(path))
    return data


def _size_text(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"


PRIVATE_DIR_MODE = 0o700


def untrusted_folder(folder: Path, *, root: Path) -> str | None:
    """Why code under ``folder`` (inside the cache ``root``) must not be loaded, or None.

    As ssh treats its directories: ``root`` and every folder below it down to ``folder``
    must be a real directory owned by this process's user and writable by no one else; each
    folder above ``root`` must be writable by no one but its owner, unless it is sticky
    (``/tmp``), where others cannot move what is not theirs. Anyone else who could write
    there could plant an object and its record side by side."""
    uid = os.geteuid()
    try:
        resolved = root.resolve()
        for above in reversed(resolved.parents):
            st = os.stat(above)
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
                return _writable_problem(above, st.st_mode)
        chain = [resolved]
        for part in folder.relative_to(root).parts:
            chain.append(chain[-1] / part)
        for own in chain:
            st = os.lstat(own)
            if not stat.S_ISDIR(st.st_mode):
                return f"{own} is not a directory (a link or a file in its place)"
            if st.st_uid != uid:
                return (f"{own} is owned by uid {st.st_uid}, not by this user (uid {uid}), "
                        "who could plant code there")
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return _writable_problem(own, st.st_mode)
    except (OSError, ValueError):
        return None  # what cannot be read is created, or refused, where it is used
    return None


def _writable_problem(folder: Path, mode: int) -> str:
    who = "every user" if mode & stat.S_IWOTH else "its group"
    return (f"{folder} is writable by {who} (mode {stat.S_IMODE(mode):o}), who could plant "
            f"code there; run `chmod go-w {folder}`")


def make_private_dirs(folder: Path) -> None:
    """Create ``folder`` and any missing parents with mode 0700, whatever the umask."""
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, PRIVATE_DIR_MODE)
            os.chmod(path, PRIVATE_DIR_MODE)


def temp_path(folder: Path, prefix: str, suffix: str) -> Path:
    """A new empty file in ``folder`` with a unique name, for output to publish later."""
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
    os.close(fd)
    return Path(name)


def digest_of(fd: int) -> tuple[str, int]:
    """SHA-256 hex digest and size of the bytes of open file ``fd``, read from its start."""
    h = hashlib.sha256()
    size = 0
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        size += len(chunk)
        offset += len(chunk)
    return h.hexdigest(), size


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive advisory lock on a key folder (publishing and re-checking a pair)."""
    fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def fsync_dir(folder: Path) -> None:
    """Flush ``folder``'s entries to disk (a rename into it survives a crash)."""
    fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically unless ``path`` already holds exactly it."""
    data = text.encode()
    with contextlib.suppress(OSError):
        if path.read_bytes() == data:
            return
    publish_bytes(path, data)


def publish_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically, on disk (fsync) before the rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def publish_recorded(tmp: Path, target: Path, extra: dict[str, str]) -> str:
    """Record ``tmp``'s digest (with ``extra`` fields) and move it to ``target``; returns the
    published digest.

    Under the folder's lock, a valid object already at ``target`` (another process built the
    same key meanwhile) is kept rather than replaced, so a verified pair never changes; an
    invalid one is replaced. The record is renamed into place before the object, and both are
    on disk (fsync) before the folder entry points at them.
    """
    with tmp.open("rb") as handle:
        # The compiler wrote it with the umask's mode (0775 under umask 002): only its
        # owner may change what will be loaded (a program keeps its owner's execute bit).
        os.fchmod(handle.fileno(), os.fstat(handle.fileno()).st_mode & 0o700)
        digest, size = digest_of(handle.fileno())
        os.fsync(handle.fileno())
    record: dict[str, str | int] = {"sha256": digest, "bytes": size, **extra}
    with folder_lock(target.parent):
        existing = matching_digest(target)
        if existing is not None:
            return existing
        publish_bytes(record_path(target), json.dumps(record, sort_keys=True).encode())
        os.replace(tmp, target)
        fsync_dir(target.parent)
    return digest


def record_path(artifact: Path) -> Path:
    """Where ``artifact``'s digest record lies: beside it, ``.json`` for its last suffix."""
    return artifact.with_suffix(RECORD_SUFFIX)


def recorded(artifact: Path) -> tuple[str, int] | None:
    """(sha256, size) from ``artifact``'s record, or None if it is missing or malformed."""
    try:
        with os.fdopen(open_regular(record_path(artifact)), "rb") as handle:
            raw = handle.read(RECORD_MAX_BYTES + 1)
    except OSError:
        return None
    if len(raw) > RECORD_MAX_BYTES:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    digest, size = data.get("sha256"), data.get("bytes")
    if not isinstance(digest, str) or not isinstance(size, int) or isinstance(size, bool):
        return None
    return digest, size


def fd_matches(artifact: Path, fd: int) -> str | None:
    """The digest of open ``fd`` if it equals ``artifact``'s record, else None."""
    expected = recorded(artifact)
    if expected is None or os.fstat(fd).st_size != expected[1]:
        return None
    digest, _ = digest_of(fd)
    return digest if digest == expected[0] else None


def matching_digest(artifact: Path) -> str | None:
    """The digest of ``artifact`` if its bytes match its record, else None."""
    try:
        fd = open_regular(artifact)
    except OSError:
        return None
    try:
        return fd_matches(artifact, fd)
    finally:
        os.close(fd)
