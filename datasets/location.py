"""Where a store lives: a local directory or any URI pyarrow's filesystems understand."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import pyarrow.fs as pafs

from tunecache.datasets.errors import DatasetError

HOME_ENV = "TUNECACHE_HOME"


def default_root() -> str:
    """``$TUNECACHE_HOME`` if set, else ``<user cache dir>/tunecache/store``."""
    env = os.environ.get(HOME_ENV, "").strip()
    if env:
        return env
    return str(Path(platformdirs.user_cache_dir("tunecache")) / "store")


@dataclass(frozen=True)
class Location:
    """A filesystem plus the base path of a store inside it.

    ``local`` is true for the local filesystem, where atomic writes use a hidden temporary
    name, fsync and rename; elsewhere (object stores) each file is written with one PUT.
    """

    fs: pafs.FileSystem
    base: str
    uri: str

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def path(self, relative: str) -> str:
        """The filesystem path of ``relative`` (a ``/``-joined path inside the store)."""
        return f"{self.base}/{relative}" if relative else self.base


def resolve(root: str | os.PathLike[str] | Location | None = None,
            filesystem: pafs.FileSystem | None = None) -> Location:
    """Resolve a store root: a path, a URI (``s3://bucket/prefix?...``) or None (default).

    With ``filesystem`` given, ``root`` is a path inside that filesystem.
    """
    if isinstance(root, Location):
        return root
    text = os.fspath(root) if root is not None else default_root()
    if filesystem is not None:
        return Location(filesystem, text.rstrip("/") or "/", text)
    if "://" in text:
        try:
            fs, base = pafs.FileSystem.from_uri(text)
        except (ValueError, OSError) as exc:
            raise DatasetError(f"cannot open store {text!r}: {exc}") from None
        return Location(fs, base.rstrip("/"), text)
    path = Path(text).expanduser().absolute()
    return Location(pafs.LocalFileSystem(), path.as_posix().rstrip("/") or "/", str(path))
