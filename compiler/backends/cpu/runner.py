"""The CPU backend's native runner: a small C function that walks a plan of kernel calls.

A plan is plain data: per step, a kernel entry (an index into a table of function
pointers) and its arguments, each a (region, byte offset) pair; a region is a base pointer
(the arena, a constant, a graph input or output) that the caller fills in before a run. The
runner turns each step's references into the ``void **args`` every generated kernel takes
(:mod:`tunecache.compiler.codegen.abi`) and calls it: no Python between kernels. It is
built once per machine through the same content-addressed build cache as kernels. The same
library holds the strided copy that data-movement steps run (shared among the program's
threads when large) and the loop that times a kernel on rotated copies of its weights
(:func:`tunecache.compiler.backends.cpu.kernel.rotating_timer`).
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import numpy as np

from tunecache.compiler.backends import Artifact
from tunecache.compiler.backends.cpu.build import build_source, open_verified
from tunecache.compiler.backends.cpu.threads import configure_openmp

MAX_ARGS = 16
"""Most arguments a kernel takes (conv2d: X, W, bias, add, out)."""
PARALLEL_MIN_BYTES = 256 << 10
"""A strided copy this large is shared among the program's threads (smaller ones cost
less than waking them)."""
PIECE_MIN_BYTES = 64 << 10
"""The smallest piece a long contiguous run of a shared copy is cut into."""

STEP_DTYPE = np.dtype([("fn", np.int32), ("nargs", np.int32), ("first", np.int32)])
"""One step: entry index, argument count, index of its first reference."""
REF_DTYPE = np.dtype([("region", np.int64), ("offset", np.int64)])
"""One argument: base pointer index and byte offset from it."""

_SOURCE = f"""\
#include <stdint.h>
#include <string.h>
#include <time.h>
typedef int (*tc_entry)(void **);
typedef struct {{ int32_t fn, nargs, first; }} tc_step;
typedef struct {{ int64_t region, offset; }} tc_ref;

/* Run steps [0, n); 0 when every kernel succeeded, else 1 + the failing step. */
int tc_run_plan(int64_t n, const tc_step *steps, const tc_ref *refs,
                tc_entry const *entries, char *const *bases) {{
  void *args[{MAX_ARGS}];
  for (int64_t s = 0; s < n; ++s) {{
    const tc_step *step = &steps[s];
    const tc_ref *ref = &refs[step->first];
    for (int32_t i = 0; i < step->nargs; ++i) args[i] = bases[ref[i].region] + ref[i].offset;
    if (entries[step->fn](args) != 0) return (int)(s + 1);
  }}
  return 0;
}}

/* tc_run_plan, adding each step's wall seconds to seconds[s] (a profile). */
int tc_run_plan_timed(int64_t n, const tc_step *steps, const tc_ref *refs,
                      tc_entry const *entries, char *const *bases, double *seconds) {{
  void *args[{MAX_ARGS}];
  struct timespec t0, t1;
  for (int64_t s = 0; s < n; ++s) {{
    const tc_step *step = &steps[s];
    const tc_ref *ref = &refs[step->first];
    for (int32_t i = 0; i < step->nargs; ++i) args[i] = bases[ref[i].region] + ref[i].offset;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int failed = entries[step->fn](args);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    seconds[s] += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (failed != 0) return (int)(s + 1);
  }}
  return 0;
}}

/* Seconds for iters calls of entry, call i on argument vector i % copies (args holds
   copies vectors of nargs pointers): a kernel timed on weights rotated through copies that
   together exceed the caches, as a model whose weights stream from memory calls it. */
double tc_time_rotating(tc_entry entry, void **args, int64_t nargs, int64_t copies,
                        int64_t iters) {{
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int64_t i = 0; i < iters; i++) entry(args + (i % copies) * nargs);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}}

/* A strided copy (compiler/native/copies.py): args are the source, an int64 block
   {{ndim, item bytes, source offset, destination offset, threads, sizes[ndim], source
   strides[ndim], destination strides[ndim]}} (bytes), and the destination. A copy of at
   least {PARALLEL_MIN_BYTES} bytes is shared among the threads: its runs, and a long
   contiguous run cut into pieces of at least {PIECE_MIN_BYTES} bytes. */
/* n items of item bytes from s (stride ss bytes) to t (stride ts bytes). */
static inline void tc_copy_items(char *t, int64_t ts, const char *s, int64_t ss, int64_t n,
                                 int64_t item) {{
  if (item == 4) {{
    for (int64_t j = 0; j < n; j++) memcpy(t + j * ts, s + j * ss, 4);
  }} else if (item == 8) {{
    for (int64_t j = 0; j < n; j++) memcpy(t + j * ts, s + j * ss, 8);
  }} else {{
    for (int64_t j = 0; j < n; j++) memcpy(t + j * ts, s + j * ss, (size_t)item);
  }}
}}

int tc_strided_copy(void **args) {{
  const int64_t *p = (const int64_t *)args[1];
  const int64_t nd = p[0], item = p[1], threads = p[4];
  const int64_t *size = p + 5, *ss = size + nd, *ds = ss + nd;
  const char *src = (const char *)args[0] + p[2];
  char *dst = (char *)args[2] + p[3];
  const int64_t inner = size[nd - 1], si = ss[nd - 1], di = ds[nd - 1];
  const int contiguous = si == item && di == item;
  /* Not contiguous: a task copies a block of the last two dims item by item (an
     interleave's innermost dim is 2 long: one task per pair would cost more than it
     copies), its inner loop along the longer of the two. */
  const int block = !contiguous && nd >= 2;
  const int64_t rows = block ? size[nd - 2] : 1, sr = block ? ss[nd - 2] : 0,
                dr = block ? ds[nd - 2] : 0;
  const int swap = block && rows > inner;
  int64_t outer = 1;
  for (int64_t d = 0; d < nd - 1 - block; d++) outer *= size[d];
  const int64_t run = inner * item, bytes = outer * rows * run;
  const int parallel = threads > 1 && bytes >= {PARALLEL_MIN_BYTES};
  int64_t pieces = 1;
  if (parallel && contiguous && outer < 4 * threads) {{
    pieces = (4 * threads + outer - 1) / outer;
    if (pieces > run / {PIECE_MIN_BYTES}) pieces = run / {PIECE_MIN_BYTES};
    if (pieces < 1) pieces = 1;
  }}
  const int64_t tasks = outer * pieces;
  #pragma omp parallel for num_threads((int)threads) schedule(static) if(parallel)
  for (int64_t task = 0; task < tasks; task++) {{
    const int64_t o = task / pieces, piece = task % pieces;
    int64_t rem = o, so = 0, dof = 0;
    for (int64_t d = nd - 2 - block; d >= 0; d--) {{
      const int64_t i = rem % size[d];
      rem /= size[d];
      so += i * ss[d];
      dof += i * ds[d];
    }}
    const char *s = src + so;
    char *t = dst + dof;
    if (contiguous) {{
      const int64_t lo = run * piece / pieces, hi = run * (piece + 1) / pieces;
      memcpy(t + lo, s + lo, (size_t)(hi - lo));
    }} else if (swap) {{
      for (int64_t j = 0; j < inner; j++) tc_copy_items(t + j * di, dr, s + j * si, sr, rows, item);
    }} else {{
      for (int64_t r = 0; r < rows; r++) tc_copy_items(t + r * dr, di, s + r * sr, si, inner, item);
    }}
  }}
  return 0;
}}
"""
_FLAGS = ("-O2", "-fPIC", "-shared", "-fopenmp")


@cache
def build_runner() -> None:
    """Build the runner library into the build cache (once per process), without loading
    it: a process that will start workers that time kernels builds it first."""
    build_source(_SOURCE, _FLAGS)


def runner_artifact() -> Artifact:
    """The runner library's artifact (built, or found in the build cache)."""
    return build_source(_SOURCE, _FLAGS)


@cache
def _runner_library() -> ctypes.CDLL:
    # Loaded once and kept for the process (the cache holds it); checked against its build
    # record like every kernel library before any of its code runs.
    configure_openmp()  # its parallel copies bring libgomp in, like a kernel
    with open_verified(runner_artifact().path) as loadable:
        return ctypes.CDLL(loadable)


def strided_copy_entry() -> int:
    """Address of ``tc_strided_copy``, a step entry like a kernel's ``tc_kernel``."""
    address = ctypes.cast(_runner_library().tc_strided_copy, ctypes.c_void_p).value
    assert address is not None
    return address


def time_rotating_function() -> Any:
    """``tc_time_rotating`` of the runner library: ``(entry, args, nargs, copies, iters)``
    -> seconds."""
    function = _runner_library().tc_time_rotating
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                         ctypes.c_int64]
    function.restype = ctypes.c_double
    return function


class CpuPlanRunner:
    """The backend's :class:`~tunecache.compiler.backends.PlanRunner`: ``tc_run_plan`` and
    ``tc_run_plan_timed`` of the runner library, built and loaded on first use."""

    max_args = MAX_ARGS
    step_dtype = STEP_DTYPE
    ref_dtype = REF_DTYPE

    def __init__(self) -> None:
        library = _runner_library()
        self._run = library.tc_run_plan
        self._run.argtypes = [ctypes.c_int64, *[ctypes.c_void_p] * 4]
        self._run.restype = ctypes.c_int
        self._run_timed = library.tc_run_plan_timed
        self._run_timed.argtypes = [ctypes.c_int64, *[ctypes.c_void_p] * 5]
        self._run_timed.restype = ctypes.c_int

    @property
    def copy_entry(self) -> int:
        return strided_copy_entry()

    def run(self, n: int, steps: int, refs: int, entries: int, bases: int) -> int:
        return int(self._run(n, steps, refs, entries, bases))

    def run_timed(self, n: int, steps: int, refs: int, entries: int, bases: int,
                  seconds: int) -> int:
        return int(self._run_timed(n, steps, refs, entries, bases, seconds))


@cache
def plan_runner() -> CpuPlanRunner:
    """The process's plan runner (one library, loaded once)."""
    return CpuPlanRunner()
