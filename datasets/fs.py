"""Filesystem helpers: atomic publication of files, listing, reading small files.

On the local filesystem a file is written under a hidden temporary name in its target
directory (``.<name>.<random>.tmp``), fsynced, renamed into place with ``os.replace`` and the
directory fsynced: readers see the whole file or nothing, also after a crash. Object stores
have no rename, but one PUT (or a completed multipart upload) is all-or-nothing, so there the
final key is written directly. Readers ignore names starting with ``.`` or ``_``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
import uuid

import pyarrow as pa
import pyarrow.fs as pafs

from tunecache.compiler.files import UnreadableFile, read_regular
from tunecache.datasets.location import Location

TEMP_SUFFIX = ".tmp"


def write_atomic(loc: Location, relative: str, data: bytes | pa.Buffer) -> str:
    """Write ``data`` to ``relative`` inside the store so it appears all at once; its path."""
    path = loc.path(relative)
    if loc.local:
        directory, _, name = path.rpartition("/")
        os.makedirs(directory, exist_ok=True)
        temp = f"{directory}/.{name}.{uuid.uuid4().hex[:12]}{TEMP_SUFFIX}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(memoryview(data))
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        _fsync_dir(directory)
    else:
        with loc.fs.open_output_stream(path) as out:
            out.write(data if isinstance(data, bytes) else data.to_pybytes())
    return path


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


MAX_READ_BYTES = 256 << 20
"""The largest file :func:`read_bytes` reads (pointers, hardware specs, wanted lists and
cost models are kilobytes to a few megabytes): a file grown past it is refused, not read
until memory runs out."""


def read_bytes(loc: Location, relative: str) -> bytes | None:
    """The content of ``relative``, or None when it does not exist. On a local store it must
    be a regular file (a FIFO would block the reader forever; :func:`open_regular`); on any
    store, at most :data:`MAX_READ_BYTES`; :class:`UnreadableFile` otherwise."""
    try:
        if loc.local:
            return read_regular(loc.path(relative), MAX_READ_BYTES)
        with loc.fs.open_input_stream(loc.path(relative)) as handle:
            data = bytes(handle.read(MAX_READ_BYTES + 1))
        return _bounded(data, loc.path(relative))
    except FileNotFoundError:
        return None
    except UnreadableFile:
        raise
    except OSError:
        if not exists(loc, relative):
            return None
        raise


def _bounded(data: bytes, path: str) -> bytes:
    if len(data) > MAX_READ_BYTES:
        raise UnreadableFile(errno.EFBIG, f"is larger than {MAX_READ_BYTES >> 20} MiB", path)
    return data


def exists(loc: Location, relative: str) -> bool:
    return bool(loc.fs.get_file_info(loc.path(relative)).type == pafs.FileType.File)


def infos(loc: Location, base: str, recursive: bool = False) -> list[pafs.FileInfo]:
    """What lies under the absolute path ``base`` (nothing when it does not exist). On a
    local store a symbolic link is neither followed nor reported as what it points to (its
    type is Unknown, as a FIFO's is): a link planted in a shared store could lead a walk
    anywhere, or in a circle."""
    if not loc.local:
        selector = pafs.FileSelector(base, recursive=recursive, allow_not_found=True)
        return list(loc.fs.get_file_info(selector))
    found: list[pafs.FileInfo] = []
    _walk_local(base, recursive, found)
    return found


def _walk_local(base: str, recursive: bool, found: list[pafs.FileInfo]) -> None:
    try:
        entries = list(os.scandir(base))
    except (FileNotFoundError, NotADirectoryError):
        return  # gone meanwhile (a writer between its mkdir and rename), or never there
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            found.append(pafs.FileInfo(entry.path, pafs.FileType.Directory))
            if recursive:
                _walk_local(entry.path, recursive, found)
        elif stat.S_ISREG(st.st_mode):
            found.append(pafs.FileInfo(entry.path, pafs.FileType.File, size=st.st_size,
                                       mtime_ns=st.st_mtime_ns))
        else:
            found.append(pafs.FileInfo(entry.path, pafs.FileType.Unknown))


def list_names(loc: Location, relative: str) -> list[str]:
    """File names directly under ``relative`` (empty when it does not exist)."""
    return sorted(info.base_name for info in infos(loc, loc.path(relative))
                  if info.type == pafs.FileType.File)


def list_dirs(loc: Location, relative: str) -> list[str]:
    """Directory names directly under ``relative`` (empty when it does not exist)."""
    return sorted(info.base_name for info in infos(loc, loc.path(relative))
                  if info.type == pafs.FileType.Directory)


def delete(loc: Location, path: str) -> bool:
    """Delete the file at absolute ``path``; False when it was already gone."""
    try:
        loc.fs.delete_file(path)
    except FileNotFoundError:
        return False
    except OSError:
        if loc.fs.get_file_info(path).type == pafs.FileType.NotFound:
            return False
        raise
    return True


def temporaries(loc: Location, relative: str, older_than_s: float = 0.0) -> list[str]:
    """Leftover temporary files (from killed writers) under ``relative``, by absolute path."""
    if not loc.local:
        return []
    cutoff = time.time() - older_than_s
    found = []
    for info in infos(loc, loc.path(relative), recursive=True):
        if (
            info.type == pafs.FileType.File
            and info.base_name.startswith(".")
            and info.base_name.endswith(TEMP_SUFFIX)
            and (info.mtime is None or info.mtime.timestamp() <= cutoff)
        ):
            found.append(info.path)
    return sorted(found)
