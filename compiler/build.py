"""Compile generated C into shared objects, through a content-addressed artifact cache.

An artifact's key is a hash of (source, compiler identity and version, flags). The shared
object is compiled under a unique temporary name in the cache directory and published with
an atomic rename, so any number of processes may build the same kernel at once; a warm build
finds the published file and never runs the compiler.

The cache lives in ``$TUNECACHE_BUILD_CACHE``, else ``<user cache dir>/tunecache/kernels``.
The C compiler is ``$CC``, else the first of ``cc``, ``gcc``, ``clang`` on ``PATH``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from tunecache.compiler.codegen import KernelSource
from tunecache.compiler.errors import BuildError

BUILD_CACHE_ENV = "TUNECACHE_BUILD_CACHE"
DEFAULT_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class CompilerInfo:
    """Which C compiler builds kernels; ``identity`` goes into every artifact key."""

    path: str
    identity: str

    @property
    def short(self) -> str:
        return self.identity.split(";")[0]


@dataclass(frozen=True, slots=True)
class Artifact:
    """A built shared object and how it was obtained."""

    path: Path
    key: str
    cached: bool
    compile_seconds: float


def build_cache_dir() -> Path:
    env = os.environ.get(BUILD_CACHE_ENV)
    return Path(env) if env else Path(platformdirs.user_cache_dir("tunecache")) / "kernels"


@functools.cache
def _probe_compiler(path: str) -> CompilerInfo:
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


def find_compiler() -> CompilerInfo:
    """The C compiler to use, with its identity; BuildError naming what was tried if none."""
    env = os.environ.get("CC", "").strip()
    candidates = [env] if env else ["cc", "gcc", "clang"]
    for name in candidates:
        path = shutil.which(name)
        if path:
            return _probe_compiler(path)
    tried = ", ".join(candidates)
    raise BuildError(
        f"no C compiler found (tried {tried}{' from $CC' if env else ' on PATH'}); install gcc "
        "or clang, or set CC to a compiler's path"
    )


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
        return Artifact(target, key, True, 0.0)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(f"cannot create build cache folder {folder}: {exc.strerror}") from None
    _publish_text(folder / f"{key}.c", source)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{key}.", suffix=".so.tmp", dir=folder)
    os.close(fd)
    tmp = Path(tmp_name)
    command = [cc.path, *flags, "-x", "c", str(folder / f"{key}.c"), "-o", str(tmp)]
    started = time.perf_counter()
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                                check=False)
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"C compiler timed out after {timeout_s:.0f} s: {' '.join(command)}") \
            from None
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"cannot run C compiler {cc.path}: {exc.strerror}") from None
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        message = (result.stderr or result.stdout).strip()
        if len(message) > 4000:
            message = message[:2000] + "\n...\n" + message[-2000:]
        raise BuildError(
            f"C compiler failed (exit {result.returncode}) on {folder / (key + '.c')}:\n{message}"
        )
    os.replace(tmp, target)
    return Artifact(target, key, False, seconds)


def _publish_text(path: Path, text: str) -> None:
    if path.exists():
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)
