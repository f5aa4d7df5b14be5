"""The file a compiled model is saved in: a zip archive of named members behind a header
that holds the SHA-256 of everything after it.

The header makes any change to the file detectable before a byte of it is used: a flipped
bit in a member, in the archive's own structure or in the digest itself. The archive is an
ordinary zip with bytes before it, as self-extracting archives are, so ``unzip -l`` lists
it. Reading never trusts a size the archive declares: every member has a limit, the file is
opened without blocking or following a link, and only the members asked for are read.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.files import open_regular, publish_bytes

MAGIC = b"tunecache compiled model\n"
HEADER_BYTES = len(MAGIC) + len("sha256 ") + 64 + 1
MAX_PACKAGE_BYTES = 8 << 30
MAX_MEMBERS = 100_000


class PackageError(TunecacheError):
    """A compiled model's file that cannot be used: not one, damaged, or for other
    hardware or another tunecache."""


@dataclass(frozen=True)
class PackageFile:
    """An opened, digest-checked package: its members read on demand."""

    path: Path
    archive: zipfile.ZipFile

    def read(self, name: str, limit: int) -> bytes:
        """Member ``name`` (at most ``limit`` bytes); PackageError if missing or larger."""
        try:
            info = self.archive.getinfo(name)
        except KeyError:
            raise PackageError(f"{self.path}: member {name} is missing") from None
        if info.file_size > limit:
            raise PackageError(f"{self.path}: member {name} is {info.file_size} bytes, over "
                               f"its limit of {limit}")
        try:
            with self.archive.open(info) as handle:
                data = handle.read(limit + 1)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise PackageError(f"{self.path}: member {name} cannot be read ({exc})") from None
        if len(data) > limit:
            raise PackageError(f"{self.path}: member {name} is over its limit of {limit}")
        return data

    def close(self) -> None:
        self.archive.close()


def is_package(path: Path) -> bool:
    """Whether ``path`` starts like a compiled model's file (it may still be damaged)."""
    try:
        fd = open_regular(path)
    except OSError:
        return False
    try:
        return os.pread(fd, len(MAGIC), 0) == MAGIC
    finally:
        os.close(fd)


def write_package(path: Path, members: Mapping[str, bytes]) -> int:
    """Write ``members`` to ``path`` atomically (replacing it); the file's size."""
    body = io.BytesIO()
    with zipfile.ZipFile(body, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    payload = body.getvalue()
    digest = hashlib.sha256(payload).hexdigest()
    data = MAGIC + f"sha256 {digest}\n".encode() + payload
    try:
        publish_bytes(path, data)
    except OSError as exc:
        raise PackageError(f"cannot write {path}: {exc.strerror or exc}") from None
    return len(data)


def open_package(path: Path) -> PackageFile:
    """Open ``path`` and check its digest; PackageError naming what is wrong."""
    try:
        fd = open_regular(path)
    except OSError as exc:
        raise PackageError(f"cannot read compiled model {path}: {exc.strerror or exc}") \
            from None
    handle = os.fdopen(fd, "rb")
    try:
        payload = _checked_payload(path, handle)
        archive = zipfile.ZipFile(io.BytesIO(payload))
    except zipfile.BadZipFile as exc:
        raise PackageError(f"{path}: not a readable archive ({exc})") from None
    finally:
        handle.close()
    if len(archive.infolist()) > MAX_MEMBERS:
        raise PackageError(f"{path}: more than {MAX_MEMBERS} members")
    return PackageFile(path, archive)


def _checked_payload(path: Path, handle: io.BufferedReader) -> bytes:
    size = os.fstat(handle.fileno()).st_size
    if size > MAX_PACKAGE_BYTES:
        raise PackageError(f"{path} is {size} bytes, over the limit of {MAX_PACKAGE_BYTES}")
    header = handle.read(HEADER_BYTES)
    match = re.fullmatch(rb"sha256 ([0-9a-f]{64})\n", header[len(MAGIC):])
    if not header.startswith(MAGIC) or match is None:
        raise PackageError(f"{path} is not a tunecache compiled model (saved by `tunecache "
                           "compile MODEL --save FILE`)")
    payload = handle.read(MAX_PACKAGE_BYTES)
    if hashlib.sha256(payload).hexdigest() != match.group(1).decode():
        raise PackageError(f"{path} is damaged: its bytes do not match the digest in its "
                           "header; save the model again")
    return payload
