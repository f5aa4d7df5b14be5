"""The OS's permission for AMX tile state, asked for once per process before a tile kernel
runs.

Linux enables the 8 KiB tile-data state per process, on request: until a process asks
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, Linux 5.16 and later), its first
tile instruction is killed with SIGILL. The request covers every thread of the process,
those already running (OpenMP's team) and those started later, so the kernel loader makes
it once, when it loads the first artifact whose source uses tiles (``tc_needs_tiles``):
compiled models, the native program and every measurement worker load kernels through it.
"""

from __future__ import annotations

import ctypes
import os
import platform

from tunecache.compiler.errors import HardwareError

ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
SYS_ARCH_PRCTL = 158  # x86-64
_granted = False


def request_tile_state() -> None:
    """Ask Linux for the AMX tile state, once per process; :class:`HardwareError` naming the
    reason when it refuses (an old kernel, a sandbox that filters the call)."""
    global _granted
    if _granted:
        return
    error = _request()
    if error:
        raise HardwareError(f"the OS refused this process AMX tile state ({error}); its tile "
                            "kernels cannot run: compile with a hardware spec without amx_* "
                            "features (tunecache hw --json > hw.json, edit, --hardware hw.json)")
    _granted = True


def _request() -> str:
    """The refusal's reason, empty when granted."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return "AMX tile permission is requested through Linux's arch_prctl on x86-64"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0:
        return ""
    code = ctypes.get_errno()
    return f"arch_prctl(ARCH_REQ_XCOMP_PERM): {os.strerror(code)}"
