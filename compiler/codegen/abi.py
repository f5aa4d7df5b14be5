"""The kernel ABI, written once: what every generated translation unit shares.

Every kernel exports ``int tc_kernel(void **args)`` (array pointers in
``OpSignature.arguments()`` order; returns 0, or 1 when its workspace cannot be allocated) and
``double tc_time(void **args, long iters)``. Kernels that can take their weights (the second
input) packed once also export ``tc_packed_weights_floats``, ``tc_pack_weights``,
``tc_kernel_packed`` and ``tc_time_packed``.

Kind emitters build on the pieces here: :func:`preamble` (ISA prelude, includes, ``MIN``,
shape constants, ``BARRIER``, the per-thread workspace ``tc_workspace`` and
``split_range``) first, their own code, then :func:`kernel_entries` (argument unpacking,
workspace, the OpenMP team and the timers, plus the pre-packed-weights entries).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tunecache.compiler.codegen.isa import IsaDialect

if TYPE_CHECKING:
    from tunecache.compiler.ops import OpSignature

ALIGN_FLOATS = 16
"""Workspace regions and packed buffers start on 64-byte boundaries (16 floats)."""


HEADER = """\
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#define MIN(x, y) ((x) < (y) ? (x) : (y))
"""

WORKSPACE = """\
/* One workspace per calling thread, grown on demand and reused across calls. */
static __thread float *tc_ws = NULL;
static __thread size_t tc_ws_cap = 0;
static float *tc_workspace(size_t floats) {
  if (floats == 0) floats = 16;
  if (floats > tc_ws_cap) {
    free(tc_ws);
    size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    tc_ws = (float *)aligned_alloc(64, bytes);
    tc_ws_cap = tc_ws ? floats : 0;
  }
  return tc_ws;
}

/* Items [lo, hi) of n for thread tid of nth: contiguous, sizes differing by at most one
 * (the partition of OpenMP's schedule(static)). */
static void split_range(long n, int tid, int nth, long *lo, long *hi) {
  long base = n / nth, extra = n % nth;
  *lo = tid * base + (tid < extra ? tid : extra);
  *hi = *lo + base + (tid < extra ? 1 : 0);
}
"""

TIMER = """
double tc_time(void **args, long iters) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < iters; i++) tc_kernel(args);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}
"""
TIMER_PACKED = TIMER.replace("tc_time(", "tc_time_packed(").replace(
    "tc_kernel(args)", "tc_kernel_packed(args)")


def defines(constants: Mapping[str, int | str]) -> str:
    """``#define`` lines: ints become ``long`` literals, strings are written as given."""
    return "".join(f"#define {k} {f'{v}L' if isinstance(v, int) else v}\n"
                   for k, v in constants.items())


def preamble(d: IsaDialect, constants: Mapping[str, int | str], threads: int) -> str:
    """What opens every kernel: the ISA prelude, includes and ``MIN``, the shape constants,
    ``BARRIER()`` (an OpenMP barrier when ``threads > 1``, else nothing), the workspace and
    ``split_range``."""
    barrier = '_Pragma("omp barrier")' if threads > 1 else "((void)0)"
    return "\n".join([d.prelude, HEADER, defines(constants) + f"#define BARRIER() {barrier}",
                      WORKSPACE])


def unpack_args(op: OpSignature, *, rename: Mapping[str, str] | None = None,
                optional: Sequence[str] = ()) -> str:
    """C declarations of ``op``'s arrays from ``args``: ``const float *`` inputs, then the
    ``float *`` output, named as in ``op.arguments()`` (or ``rename``, for names that clash
    with a shape constant). Each ``optional`` name the op lacks is declared NULL."""
    rename = rename or {}
    args = op.arguments()
    names = [rename.get(a.name, a.name) for a in args]
    lines = [f"  const float *{name} = (const float *)args[{i}];"
             for i, name in enumerate(names[:-1])]
    lines += [f"  const float *{name} = NULL;" for name in optional if name not in names]
    lines.append(f"  float *{names[-1]} = (float *)args[{len(names) - 1}];")
    lines += [f"  (void){name};" for name in optional]
    return "\n".join(lines) + "\n"


def _team(body: str, tid: str, nth: str) -> str:
    body = re.sub(r"\bTID\b", tid, body)
    return re.sub(r"\bNTH\b", nth, body)


def parallel_entry(threads: int, body: str, ws_floats: str | None) -> str:
    """The statements of an entry function after its arguments are unpacked: get the
    workspace ``ws`` of ``ws_floats`` floats (none when None; returns 1 when it cannot be
    allocated), run ``body`` on a team of ``threads`` (``TID``/``NTH`` in it stand for the
    thread's number and the team size; a team of one runs it inline), return 0, and close the
    function."""
    ws = (f"  float *ws = tc_workspace({ws_floats});\n  if (!ws) return 1;\n"
          if ws_floats is not None else "")
    if threads == 1:
        return f"{ws}  {_team(body, '0', '1')}\n  return 0;\n}}\n"
    return (
        f"{ws}#pragma omp parallel num_threads({threads})\n  {{\n"
        "    int tid = omp_get_thread_num(), nth = omp_get_num_threads();\n"
        f"    {_team(body, 'tid', 'nth')}\n  }}\n  return 0;\n}}\n"
    )


@dataclass(frozen=True, slots=True)
class PackedWeights:
    """The pre-packed-weights ABI of a kernel: ``floats`` (a C expression) floats of packed
    weights, written by ``pack`` (C statements reading ``weights``, the second input as the
    caller holds it, and writing ``packed``, 64-byte aligned)."""

    floats: str
    pack: str


def kernel_entries(op: OpSignature, body: Callable[[bool], str], *, threads: int,
                   ws_floats: str | None, rename: Mapping[str, str] | None = None,
                   optional: Sequence[str] = (), packed: PackedWeights | None = None,
                   packed_ws_floats: str | None = None) -> str:
    """``tc_kernel`` and ``tc_time``; with ``packed``, also ``tc_kernel_packed``,
    ``tc_packed_weights_floats``, ``tc_pack_weights`` and ``tc_time_packed``.

    Each entry unpacks ``args`` (:func:`unpack_args` with ``rename`` and ``optional``) and
    runs ``body(packed)`` through :func:`parallel_entry`. ``tc_kernel_packed`` takes
    ``tc_kernel``'s arguments with the buffer ``tc_pack_weights`` filled in the weights'
    place; ``body(True)`` must read it as packed (constant weights are packed once, when a
    model is compiled). ``packed_ws_floats`` is the packed entry's workspace when it needs
    less than ``ws_floats`` (no room to pack the weights into).
    """
    unpack = unpack_args(op, rename=rename, optional=optional)

    def entry(name: str, is_packed: bool) -> str:
        ws = packed_ws_floats if is_packed and packed_ws_floats is not None else ws_floats
        return (f"int {name}(void **args) {{\n{unpack}"
                + parallel_entry(threads, body(is_packed), ws))

    out = [entry("tc_kernel", False), TIMER]
    if packed is not None:
        out += [entry("tc_kernel_packed", True),
                f"long tc_packed_weights_floats(void) {{ return {packed.floats}; }}\n",
                "void tc_pack_weights(const float *weights, float *packed) {\n"
                f"{packed.pack}\n}}\n", TIMER_PACKED]
    return "\n".join(out)
