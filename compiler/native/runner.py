"""The generic native runner: a small C function that walks a plan of kernel calls.

A plan is plain data: per step, a kernel entry (an index into a table of function
pointers) and its arguments, each a (region, byte offset) pair; a region is a base pointer
(the arena, a constant, a graph input or output) that the caller fills in before a run. The
runner turns each step's references into the ``void **args`` every generated kernel takes
(:mod:`tunecache.compiler.codegen.abi`) and calls it: no Python between kernels. It is
built once per machine through the same content-addressed build cache as kernels.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import numpy as np

from tunecache.compiler.build import build_source, open_verified

MAX_ARGS = 16
"""Most arguments a kernel takes (conv2d: X, W, bias, add, out)."""

STEP_DTYPE = np.dtype([("fn", np.int32), ("nargs", np.int32), ("first", np.int32)])
"""One step: entry index, argument count, index of its first reference."""
REF_DTYPE = np.dtype([("region", np.int64), ("offset", np.int64)])
"""One argument: base pointer index and byte offset from it."""

_SOURCE = f"""\
#include <stdint.h>
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
"""
_FLAGS = ("-O2", "-fPIC", "-shared")


@cache
def _runner_library() -> ctypes.CDLL:
    # Loaded once and kept for the process (the cache holds it); checked against its build
    # record like every kernel library before any of its code runs.
    with open_verified(build_source(_SOURCE, _FLAGS).path) as loadable:
        return ctypes.CDLL(loadable)


def run_plan_function() -> Any:
    """``tc_run_plan`` of the runner library, built on first use."""
    function = _runner_library().tc_run_plan
    function.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function
