"""Compile generated C into shared objects, through a content-addressed artifact cache.

An artifact's key is a hash of (source, compiler identity and version, flags). The shared
object is compiled under a unique temporary name in the cache directory and published with
an atomic rename, so any number of processes may build the same kernel at once; a warm build
finds the published file and never runs the compiler. A cold build compiles against a
precompiled header of the source's system headers where gcc can use one (:mod:`.pch`); the
key and the machine code are the same without it.

Integrity: beside every ``<key>.so`` lies ``<key>.json``, recording the SHA-256 and size of
the object's bytes (and of its C source) at build time. A lookup trusts a cached object only
if its bytes match that record; a truncated, replaced or unrecorded object is rebuilt, never
loaded; :func:`open_verified` checks just before each load. A cache that is not private is
refused (:class:`BuildError` naming the folder and the fix): one owned by another user, or
writable by its group or every user, or under a folder others may write to, where anyone
could plant an object and a matching record side by side, or swap a file between the check
and the load. Folders are created 0700 and objects published with their owner's bits only
(0600, 0700 for a program), whatever the umask.

The cache lives in ``$TUNECACHE_BUILD_CACHE``, else ``<user cache dir>/tunecache/kernels``.
The C compiler is ``$CC``, else the first of ``cc``, ``gcc``, ``clang`` on ``PATH``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from tunecache.compiler.backends import Artifact
from tunecache.compiler.backends.cpu.pch import include_flags
from tunecache.compiler.codegen import KernelSource
from tunecache.compiler.errors import BuildError
from tunecache.compiler.files import (
    fd_matches,
    folder_lock,
    make_private_dirs,
    matching_digest,
    open_regular,
    publish_recorded,
    publish_text,
    temp_path,
    untrusted_folder,
)

BUILD_CACHE_ENV = "TUNECACHE_BUILD_CACHE"
DEFAULT_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class CompilerInfo:
    """Which C compiler builds kernels; ``identity`` goes into every artifact key."""

    path: str
    identity: str
    missing: str = ""
    """Why there is no compiler, where ``path`` is empty (an adopted toolchain's identity)."""

    @property
    def short(self) -> str:
        return self.identity.split(";")[0]


def build_cache_dir() -> Path:
    env = os.environ.get(BUILD_CACHE_ENV)
    return Path(env) if env else Path(platformdirs.user_cache_dir("tunecache")) / "kernels"


@functools.cache
def probe_compiler(path: str) -> CompilerInfo:
    """The identity of the C compiler at ``path`` (its version line and target), asked once."""
    try:
        version = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        machine = subprocess.run(
            [path, "-dumpmachine"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as exc:
        raise BuildError(f"cannot run C compiler {path}: {exc.strerror}") from None
    first = (version.stdout or version.stderr).strip().splitlines()
    if version.returncode != 0 or not first:
        raise BuildError(
            f"C compiler {path} does not answer --version: {(version.stderr or '').strip()}"
        )
    return CompilerInfo(path, f"{first[0]};{machine.stdout.strip()}")


_adopted: list[str] = []
"""The identity :func:`adopt_toolchain` set for this process (at most one)."""


def adopt_toolchain(identity: str) -> None:
    """Where this machine has no C compiler, look artifacts up as if built by the compiler
    ``identity``: a compiled model's package brought them (``install_artifact``), and a warm
    lookup then needs no compiler; a cold build says what is missing."""
    _adopted[:] = [identity]


def find_compiler() -> CompilerInfo:
    """The C compiler to use, with its identity; BuildError naming what was tried if none
    (or, where a toolchain was adopted, that one's identity with no path)."""
    env = os.environ.get("CC", "").strip()
    candidates = [env] if env else ["cc", "gcc", "clang"]
    for name in candidates:
        path = shutil.which(name)
        if path:
            return probe_compiler(path)
    tried = ", ".join(candidates)
    missing = (f"no C compiler found (tried {tried}{' from $CC' if env else ' on PATH'}); "
               "install gcc or clang, or set CC to a compiler's path")
    if _adopted:
        return CompilerInfo("", _adopted[0], missing)
    raise BuildError(missing)


def artifact_key(source: str, compiler: CompilerInfo, flags: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (source, compiler.identity, " ".join(flags)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def build(
    kernel: KernelSource,
    *,
    cache_dir: Path | None = None,
    compiler: CompilerInfo | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Artifact:
    """Return the shared object for ``kernel``, compiling it only if it is not cached."""
    return build_source(kernel.code, kernel.flags, cache_dir=cache_dir, compiler=compiler,
                        timeout_s=timeout_s)


def build_source(
    source: str,
    flags: tuple[str, ...],
    *,
    cache_dir: Path | None = None,
    compiler: CompilerInfo | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Artifact:
    """Compile C ``source`` with ``flags`` into a cached shared object (see module doc)."""
    cc = compiler or find_compiler()
    root = cache_dir or build_cache_dir()
    key = artifact_key(source, cc, flags)
    folder = root / key[:2]
    target = folder / f"{key}.so"
    if target.exists():
        _refuse_untrusted(folder, root)
        digest = matching_digest(target)
        if digest is not None:
            return Artifact(target, key, True, 0.0, digest)
    if not cc.path:
        raise BuildError(f"{cc.missing} (artifact {key} is not among those the compiled "
                         "model brought: save it again with this tunecache version)")
    _private_folder(folder, root)
    publish_text(folder / f"{key}.c", source)
    tmp = temp_path(folder, f".{key}.", ".so.tmp")
    try:
        pch = include_flags(cc.path, cc.identity, flags, source, root, timeout_s)
        seconds = _compile(cc, flags + pch, folder / f"{key}.c", tmp, timeout_s)
        digest = publish_recorded(
            tmp, target, {"source_sha256": hashlib.sha256(source.encode()).hexdigest()})
    finally:
        tmp.unlink(missing_ok=True)
    return Artifact(target, key, False, seconds, digest)


def install_artifact(key: str, data: bytes, *, cache_dir: Path | None = None) -> Artifact:
    """Publish ``data`` as the shared object of artifact ``key`` (built elsewhere: a compiled
    model's package), with its digest record, as a build would; an object already there
    that matches its own record is kept."""
    if not re.fullmatch(r"[0-9a-f]{32}", key):
        raise BuildError(f"artifact key {key!r} is not 32 lowercase hex digits")
    root = cache_dir or build_cache_dir()
    folder = root / key[:2]
    _private_folder(folder, root)
    tmp = temp_path(folder, f".{key}.", ".so.tmp")
    try:
        tmp.write_bytes(data)
        digest = publish_recorded(tmp, folder / f"{key}.so", {"installed": "package"})
    finally:
        tmp.unlink(missing_ok=True)
    return Artifact(folder / f"{key}.so", key, True, 0.0, digest)


def _private_folder(folder: Path, root: Path) -> None:
    try:
        make_private_dirs(folder)
    except OSError as exc:
        raise BuildError(f"cannot create build cache folder {folder}: {exc.strerror}") from None
    _refuse_untrusted(folder, root)


def _compile(cc: CompilerInfo, flags: tuple[str, ...], source: Path, out: Path,
             timeout_s: float) -> float:
    """Run the compiler on ``source`` into ``out``; its wall time, or BuildError."""
    command = [cc.path, *flags, "-x", "c", str(source), "-o", str(out)]
    started = time.perf_counter()
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                                check=False)
    except subprocess.TimeoutExpired:
        raise BuildError(f"C compiler timed out after {timeout_s:.0f} s: {' '.join(command)}") \
            from None
    except OSError as exc:
        raise BuildError(f"cannot run C compiler {cc.path}: {exc.strerror}") from None
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip()
        if len(message) > 4000:
            message = message[:2000] + "\n...\n" + message[-2000:]
        raise BuildError(f"C compiler failed (exit {result.returncode}) on {source}:\n{message}")
    return time.perf_counter() - started


def _refuse_untrusted(folder: Path, root: Path) -> None:
    """BuildError unless ``folder`` (in the cache ``root``) may hold code this process
    loads (:func:`~tunecache.compiler.files.untrusted_folder`)."""
    problem = untrusted_folder(folder, root=root)
    if problem is not None:
        raise BuildError(f"build cache not private: {problem}, or set ${BUILD_CACHE_ENV} to "
                         "a directory only you can write")


@contextlib.contextmanager
def open_verified(artifact: Path) -> Iterator[str]:
    """The path to load ``artifact`` from, inside the ``with``, once its bytes are known to
    match its build record; BuildError (never a load) if they do not.

    The bytes are hashed through a descriptor held open for the ``with``; on leaving it, a
    path that no longer names that same file (replaced meanwhile) is a BuildError too. The
    loader is given the real path, not ``/proc/self/fd/N``: the dynamic loader treats a name
    it has loaded before as the same library, and descriptor numbers are reused.
    """
    path = Path(artifact)
    _refuse_untrusted(path.parent, path.parent.parent)
    fd = _open_artifact(path)
    try:
        if fd_matches(path, fd) is None:
            # A publisher may be between renaming the record and the object: look again
            # under its lock before calling the artifact bad.
            os.close(fd)
            fd = -1
            with folder_lock(path.parent):
                fd = _open_artifact(path)
                if fd_matches(path, fd) is None:
                    raise BuildError(
                        f"kernel artifact {path} does not match the digest recorded when it "
                        "was built (truncated, replaced, or built before digests were "
                        "recorded); not loading it: build it again, or delete it"
                    )
        yield str(path)
        if not _same_file(fd, path):
            raise BuildError(f"kernel artifact {path} was replaced while it was loaded; "
                             f"check who writes to the build cache {path.parent.parent}")
    finally:
        if fd >= 0:
            os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        now = path.stat()
    except OSError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _open_artifact(path: Path) -> int:
    try:
        return open_regular(path)
    except OSError as exc:
        raise BuildError(f"cannot open kernel artifact {path}: {exc.strerror}") from None
