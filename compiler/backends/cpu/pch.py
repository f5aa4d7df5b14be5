"""Precompiled headers for generated kernels: the system headers parsed once per flag set.

Every kernel includes the same few system headers (``immintrin.h`` above all), and gcc spent
about 1 s of a small kernel's 1.5 s parsing them. The headers a source includes are written
to ``<build cache>/pch/<key>/tc_includes.h`` and compiled, with the kernel's own flags, into
``tc_includes.h.gch`` beside it; a kernel is then compiled with ``-include`` of that header,
which gcc reads from the ``.gch`` (the source's own ``#include`` lines are then no-ops). The
key hashes the header's text, the compiler's identity and the flags, since gcc refuses a
precompiled header built with other code-generating options.

Nothing depends on it: gcc falls back to the text header when the ``.gch`` does not fit,
and where no ``.gch`` can be had (clang, a failed build, ``TUNECACHE_PCH=0``) kernels are
compiled as before. The ``.gch`` is published with a digest record like a kernel's shared
object and is used only while its bytes match that record; the kernel's artifact key does not
change, since the machine code is the same either way.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import threading
from pathlib import Path

from tunecache.compiler.files import (
    make_private_dirs,
    matching_digest,
    publish_recorded,
    publish_text,
    temp_path,
    untrusted_folder,
)

PCH_ENV = "TUNECACHE_PCH"
HEADER_NAME = "tc_includes.h"
_SYSTEM_INCLUDE = re.compile(r"^#include <[\w./]+>$", re.MULTILINE)
_HEADER_MACRO = re.compile(r"^#\s*(define\s+_|undef)", re.MULTILINE)
"""A feature-test macro (or an undefinition) before an include changes what the headers
declare, so such a source is compiled without the precompiled header."""
_LINK_ONLY = frozenset({"-shared"})
_lock = threading.Lock()
_known: dict[Path, tuple[int, int, int] | None] = {}
"""Per process: the (inode, size, mtime) of the ``.gch`` checked against its record, or None
where none could be had; a ``.gch`` whose stat changed since is checked again."""


def include_flags(compiler: str, identity: str, flags: tuple[str, ...], source: str,
                  root: Path, timeout_s: float) -> tuple[str, ...]:
    """``("-include", header)`` for a precompiled header of ``source``'s system includes,
    built on first use under ``root``; ``()`` where none can be had."""
    found = list(_SYSTEM_INCLUDE.finditer(source))
    if (not found or "clang" in identity.lower() or os.environ.get(PCH_ENV) == "0"
            or _HEADER_MACRO.search(source, 0, found[-1].start())):
        return ()
    includes = tuple(dict.fromkeys(m.group(0) for m in found))
    text = "\n".join(includes) + "\n"
    key = hashlib.sha256("\0".join((text, identity, " ".join(flags))).encode()).hexdigest()
    header = root / "pch" / key[:24] / HEADER_NAME
    gch = header.with_name(HEADER_NAME + ".gch")
    with _lock:
        if header not in _known or (_known[header] and _known[header] != _stat(gch)):
            _known[header] = _stat(gch) if _usable(compiler, flags, header, text,
                                                   timeout_s) else None
        return ("-include", str(header)) if _known[header] else ()


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _usable(compiler: str, flags: tuple[str, ...], header: Path, text: str,
            timeout_s: float) -> bool:
    """Whether ``header``'s ``.gch`` matches its record, building it first if it does not;
    never in a folder that is not private."""
    gch = header.with_name(HEADER_NAME + ".gch")
    root = header.parent.parent.parent
    if untrusted_folder(header.parent, root=root) is not None:
        return False
    if _holds(header, text) and matching_digest(gch) is not None:
        return True
    try:
        make_private_dirs(header.parent)
        if untrusted_folder(header.parent, root=root) is not None:
            return False
        publish_text(header, text)
        tmp = temp_path(header.parent, f".{gch.name}.", ".tmp")
        try:
            command = [compiler, *(f for f in flags if f not in _LINK_ONLY), "-x", "c-header",
                       str(header), "-o", str(tmp)]
            built = subprocess.run(command, capture_output=True, timeout=timeout_s, check=False)
            if built.returncode != 0:
                return False
            publish_recorded(tmp, gch, {"header_sha256": hashlib.sha256(text.encode())
                                        .hexdigest()})
        finally:
            tmp.unlink(missing_ok=True)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def _holds(path: Path, text: str) -> bool:
    try:
        return path.read_text() == text
    except (OSError, UnicodeDecodeError):
        return False
