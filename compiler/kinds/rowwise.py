"""What the row-wise kinds share (``softmax``, ``layernorm``): schedule legality and C loops.

Both reduce each row of a row-major ``[M, N]`` array along its contiguous last axis, then
write the row again, so their kernels are a few *sweeps* over a row. Their schedule families
have the same knobs (each kind documents what ``passes`` means for it):

* ``vec`` (1, 2, 4): vectors per step of the inner loop, each with its own accumulator;
* ``unroll`` (1, 2, 4): ``#pragma GCC unroll`` of that loop;
* ``rows`` (1..8): rows handled together, interleaved in one loop (independent reduction
  chains; per-column data such as layernorm's gamma is loaded once for all of them);
* ``passes``: sweeps over a row (e.g. 2 = statistics in one sweep, then the output);
* ``threads``: OpenMP threads, each taking a contiguous range of rows.

A sweep runs ``vec``-vector steps over the columns every interleaved row has, then finishes
each row alone: whole vectors, then one partial vector (``VLOADU_PART``/``VSTOREU_PART``), so
any ``N`` (below the lanes too) is exact and nothing is read or written past a row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tunecache.compiler.codegen.abi import HEADER, TIMER, WORKSPACE, parallel_entry
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import ScheduleData, threads_problem

ROW_VECS = (1, 2, 4)
ROW_UNROLLS = (1, 2, 4)
MAX_ROWS = 8


@dataclass(frozen=True, slots=True)
class RowSchedule(ScheduleData):
    """The knobs every row-wise schedule family has (each family sets its ``family`` and
    may change the ``passes`` default)."""

    vec: int = 1
    unroll: int = 1
    rows: int = 1
    passes: int = 2
    threads: int = 1

    def __str__(self) -> str:
        return f"v{self.vec} u{self.unroll} r{self.rows} p{self.passes} t{self.threads}"


def row_vectors(op: OpSignature, lanes: int) -> int:
    """Vectors (the last one possibly partial) in a row of ``op``."""
    return -(-op.dim("N") // lanes)


def register_budget(hw: HardwareSpec) -> int:
    """Accumulators a row block may keep (``rows * vec``): half the vector registers, the
    rest holding loaded vectors and constants (``VEXP`` needs a few)."""
    return hw.vector_registers // 2


def row_problems(op: OpSignature, s: RowSchedule, hw: HardwareSpec,
                 passes: Sequence[int]) -> list[str]:
    """Every reason the shared knobs of ``s`` are illegal for ``op`` on ``hw`` (``passes``:
    the sweep counts the op allows)."""
    found: list[str] = []
    vectors = row_vectors(op, hw.lanes)
    m = op.dim("M")
    if s.vec not in ROW_VECS:
        found.append(f"vec={s.vec}; expected one of {', '.join(map(str, ROW_VECS))} "
                     "(vectors per inner-loop step)")
    elif s.vec > vectors:
        found.append(f"vec={s.vec} exceeds the {vectors} vector(s) of {hw.lanes} lanes in a row "
                     f"of N={op.dim('N')}")
    if s.unroll not in ROW_UNROLLS:
        found.append(f"unroll={s.unroll}; expected one of {', '.join(map(str, ROW_UNROLLS))}")
    if not 1 <= s.rows <= MAX_ROWS:
        found.append(f"rows={s.rows} out of range 1..{MAX_ROWS}")
    elif s.rows > m:
        found.append(f"rows={s.rows} exceeds the op's M={m} rows")
    if s.vec in ROW_VECS and 1 <= s.rows <= MAX_ROWS and s.rows * s.vec > register_budget(hw):
        found.append(f"rows*vec={s.rows * s.vec} accumulators exceed {register_budget(hw)} "
                     f"(half the {hw.vector_registers} vector registers of {hw.isa})")
    if s.passes not in passes:
        found.append(f"passes={s.passes}; expected one of {', '.join(map(str, passes))} "
                     f"for {op.text}")
    found += threads_problem(s.threads, hw)
    return found


def default_shape(op: OpSignature, hw: HardwareSpec) -> tuple[int, int]:
    """(vec, rows) for a default schedule: four accumulators per row block in all, as
    (vec, rows) = (2, 2) for rows of 2..128 vectors, (4, 1) for longer rows (a block of
    several would leave L1) and (1, 4) for rows of one vector. Measured on AVX2 (softmax
    N=128, layernorm N=768 and RMSNorm N=4096), these were within 5% of the best."""
    vectors = row_vectors(op, hw.lanes)
    if vectors > 128:
        vec, rows = 4, 1
    elif vectors >= 2:
        vec, rows = 2, 2
    else:
        vec, rows = 1, 4
    return vec, min(rows, op.dim("M"))


Step = Callable[[int, str, int], list[str]]
"""``step(k, j, nv)``: statements for row ``k`` of a block on ``nv`` whole vectors at
column ``j`` (a C expression)."""
Part = Callable[[int, str], list[str]]
"""``part(k, j)``: statements for row ``k`` on its last ``n`` (``0 < n < lanes``, an int in
scope) columns from ``j``."""


def sweep(rows: int, vec: int, unroll: int, lanes: int, lengths: Sequence[str], step: Step,
          part: Part, shared: Callable[[str, int], list[str]] | None = None) -> list[str]:
    """C statements for one sweep over ``rows`` rows whose lengths are ``lengths`` (C
    expressions, e.g. the constant ``N``): ``vec``-vector steps interleaved over the rows
    while every row has them, then each row alone, vector by vector, then its partial
    vector. ``shared(j, nv)`` are statements run once per step before the rows' (per-column
    loads that the rows share)."""
    width = vec * lanes
    common = lengths[0] if len(set(lengths)) == 1 else "lmin"
    out = ["{"]
    if common == "lmin":
        out.append(f"  long lmin = {lengths[0]};")
        out += [f"  if ({length} < lmin) lmin = {length};" for length in lengths[1:]]
    out += ["  long j = 0;", f"#pragma GCC unroll {unroll}",
            f"  for (; j + {width} <= {common}; j += {width}) {{"]
    if shared is not None:
        out += ["    " + line for line in shared("j", vec)]
    for k in range(rows):
        out += ["    " + line for line in step(k, "j", vec)]
    out.append("  }")
    for k, length in enumerate(lengths):
        out += ["  {", "    long jj = j;", f"    for (; jj + {lanes} <= {length}; jj += {lanes}) {{"]
        if shared is not None:
            out += ["      " + line for line in shared("jj", 1)]
        out += ["      " + line for line in step(k, "jj", 1)]
        out += ["    }", f"    if (jj < {length}) {{", f"      const int n = (int)({length} - jj);"]
        out += ["      " + line for line in part(k, "jj")]
        out += ["    }", "  }"]
    out.append("}")
    return out


def translation_unit(prelude: str, constants: dict[str, int], row_args: str,
                     block: Callable[[int], str], s: RowSchedule, args_setup: str) -> str:
    """A row-wise kernel's C: the ISA prelude, the ABI header and workspace, ``constants``
    as ``#define``s, the ``row_args`` struct (its C members), ``block(1)`` and
    ``block(s.rows)`` (the row-block functions), and the entry points and timer."""
    parts = [prelude, HEADER, "".join(f"#define {k} {v}L\n" for k, v in constants.items()),
             WORKSPACE, f"typedef struct {{ {row_args} }} row_args;\n", block(1)]
    if s.rows > 1:
        parts.append(block(s.rows))
    parts += [row_entries(s.rows, s.threads, args_setup), TIMER]
    return "\n".join(parts)


def row_entries(rows: int, threads: int, args_setup: str) -> str:
    """``tc_kernel`` over all rows: ``args_setup`` fills ``row_args a`` from ``args``; each
    thread takes a contiguous range of rows, in blocks of ``rows`` (``row_block{rows}``),
    the remainder one by one (``row_block1``)."""
    blocks = (f"  for (; r + {rows} <= hi; r += {rows}) row_block{rows}(a, r);\n"
              if rows > 1 else "")
    body = (
        "static void row_range(const row_args *a, int tid, int nth) {\n"
        "  long lo, hi;\n  split_range(M, tid, nth, &lo, &hi);\n  long r = lo;\n"
        f"{blocks}  for (; r < hi; r++) row_block1(a, r);\n}}\n\n"
    )
    entry = ("int tc_kernel(void **args) {\n" + args_setup
             + parallel_entry(threads, "(void)ws; row_range(&a, TID, NTH);", "0"))
    return body + entry


def vector_names(prefix: str, k: int, count: int) -> list[str]:
    """``prefix{k}_{v}`` for v < count: one row's accumulators."""
    return [f"{prefix}{k}_{v}" for v in range(count)]


def tree(op: str, names: Sequence[str]) -> str:
    """A balanced C expression combining ``names`` with the binary macro ``op``."""
    items = list(names)
    while len(items) > 1:
        paired = [f"{op}({a}, {b})" for a, b in zip(items[::2], items[1::2], strict=False)]
        items = paired + ([items[-1]] if len(items) % 2 else [])
    return items[0]
