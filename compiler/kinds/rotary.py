"""The ``rotary`` kind: rotary position embeddings, ``Y = X * COS + rotate_half(X) * SIN``.

Dims: ``M`` rows of ``D`` contiguous floats (``D`` even: the head dimension), ``S`` table
rows. Row ``r`` of ``X`` uses row ``r % S`` of the tables, so a ``[B, H, S, D]`` tensor of
queries or keys is ``M = B*H*S`` rows whose position is the table row (Llama's layout; the
tables are the same for every batch and head). With ``h = D / 2``,
``rotate_half(x) = concat(-x[h:], x[:h])``, i.e. per row::

    y[j]     = x[j] * cos[j]         - x[j + h] * sin[j]          (j < h)
    y[j + h] = x[j + h] * cos[j + h] + x[j] * sin[j + h]

The tables are full ``[S, D]`` (no assumption that their halves repeat). Arguments:
``X[M,D]``, ``COS[S,D]``, ``SIN[S,D]``, then ``Y[M,D]``.

Schedule (:class:`RotarySchedule`): a thread takes a contiguous range of rows; each row is
swept over its first half ``vec`` vectors per step (each step reads the matching vectors of
the second half too), the step loop unrolled ``unroll`` times, then whole vectors, then one
partial vector, so any even ``D`` is exact and nothing is read or written past a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tunecache.compiler.codegen.abi import HEADER, TIMER, WORKSPACE
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import OpKind, register
from tunecache.compiler.kinds.rowwise import row_entries
from tunecache.compiler.ops import KindSpec, OpSignature, TensorArg
from tunecache.compiler.schedule import ScheduleData, threads_problem

__all__ = ["ROTARY_UNROLLS", "ROTARY_VECS", "RotarySchedule", "half_vectors", "rotary_op"]

ROTARY_VECS = (1, 2, 4)
ROTARY_UNROLLS = (1, 2, 4)


@dataclass(frozen=True, slots=True)
class RotarySchedule(ScheduleData):
    """Knobs of a rotary kernel: ``vec`` vectors of each half-row per step, ``unroll`` of
    the step loop, ``threads``."""

    family: ClassVar[str] = "rotary"

    vec: int = 1
    unroll: int = 1
    threads: int = 1

    def __str__(self) -> str:
        return f"v{self.vec} u{self.unroll} t{self.threads}"


def rotary_op(M: int, D: int, S: int, *, dtype: str = "float32") -> OpSignature:
    """``Y[M,D] = X * COS + rotate_half(X) * SIN``, row ``r`` using table row ``r % S``."""
    return OpSignature(KIND.name, (("M", M), ("D", D), ("S", S)), dtype, (), ())


def _signature_problems(op: OpSignature) -> list[str]:
    m, d, s = op.dim("M"), op.dim("D"), op.dim("S")
    found = []
    if d % 2:
        found.append(f"D={d} must be even (rotate_half swaps the two halves of a row)")
    if m % s:
        found.append(f"S={s} does not divide M={m} (row r uses table row r % S)")
    return found


def _arguments(op: OpSignature) -> tuple[TensorArg, ...]:
    m, d, s = op.dim("M"), op.dim("D"), op.dim("S")
    return (TensorArg("X", (m, d), "input"), TensorArg("COS", (s, d), "input"),
            TensorArg("SIN", (s, d), "input"), TensorArg("Y", (m, d), "output"))


def _flops(op: OpSignature) -> int:
    """Per element: two multiplies and an add (the negation is folded into a subtract)."""
    return 3 * op.dim("M") * op.dim("D")


def _reference(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """The op in numpy, in the inputs' dtype, as the exporters write it."""
    x, cos, sin = inputs
    m, d, s = op.dim("M"), op.dim("D"), op.dim("S")
    h = d // 2
    rows = x.reshape(m // s, s, d)
    rotated = np.concatenate([-rows[..., h:], rows[..., :h]], axis=-1)
    return (rows * cos + rotated * sin).reshape(m, d)


def _tolerance(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> tuple[float, float]:
    """A few float32 ulps of the largest product (the two terms may cancel)."""
    x, cos, sin = (np.abs(a).max(initial=0.0) for a in inputs)
    return 1e-5, 4e-7 * float(x) * float(max(cos, sin)) + 1e-7


def _random_inputs(op: OpSignature, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Standard normal ``X`` and real cos/sin tables of Llama's frequencies."""
    d, s = op.dim("D"), op.dim("S")
    x = rng.standard_normal((op.dim("M"), d), dtype=np.float32)
    cos, sin = rotary_tables(s, d)
    return x, cos, sin


def rotary_tables(s: int, d: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """Llama's ``[S, D]`` cos and sin tables for positions ``0 .. S-1``."""
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    angles = np.outer(np.arange(s, dtype=np.float64), inv)
    angles = np.concatenate([angles, angles], axis=1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


# -- schedules ------------------------------------------------------------------------------


def half_vectors(op: OpSignature, lanes: int) -> int:
    """Vectors (the last one possibly partial) in half a row."""
    return -(-(op.dim("D") // 2) // lanes)


def rotary_problems(op: OpSignature, s: RotarySchedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``s`` is illegal for the rotary ``op`` on ``hw`` (empty when legal)."""
    found: list[str] = []
    vectors = half_vectors(op, hw.lanes)
    if s.vec not in ROTARY_VECS:
        found.append(f"vec={s.vec}; expected one of {', '.join(map(str, ROTARY_VECS))}")
    elif s.vec > vectors:
        found.append(f"vec={s.vec} exceeds the {vectors} vector(s) of {hw.lanes} lanes in half "
                     f"a row of D={op.dim('D')}")
    if s.unroll not in ROTARY_UNROLLS:
        found.append(f"unroll={s.unroll}; expected one of {', '.join(map(str, ROTARY_UNROLLS))}")
    found += threads_problem(s.threads, hw)
    return found


def default_rotary_schedule(op: OpSignature, hw: HardwareSpec,
                            threads: int = 1) -> RotarySchedule:
    """Two vectors of each half per step where a half-row has them (four independent
    products in flight), one otherwise."""
    return RotarySchedule(vec=min(2, half_vectors(op, hw.lanes)), threads=threads)


# -- C emitter ------------------------------------------------------------------------------


def _step(j: str, n: str | None) -> list[str]:
    """Statements for the vector at column ``j`` of the first half and ``j + H`` of the
    second; ``n``: the lanes of a partial vector (None: a whole one)."""
    def load(p: str) -> str:
        return f"VLOADU({p})" if n is None else f"VLOADU_PART({p}, {n})"

    def store(p: str, v: str) -> str:
        return f"VSTOREU({p}, {v});" if n is None else f"VSTOREU_PART({p}, {v}, {n});"

    return [
        "{",
        f"  const vec x1 = {load(f'x + {j}')}, x2 = {load(f'x + {j} + HALF')};",
        "  " + store(f"y + {j}", f"VSUB(VMUL(x1, {load(f'c + {j}')}), "
                                 f"VMUL(x2, {load(f's + {j}')}))"),
        "  " + store(f"y + {j} + HALF", f"VFMA(x1, {load(f's + {j} + HALF')}, "
                                     f"VMUL(x2, {load(f'c + {j} + HALF')}))"),
        "}",
    ]


def _row(s: RotarySchedule, lanes: int) -> str:
    """``row_block1(a, r)``: one row."""
    width = s.vec * lanes
    body = ["const float *restrict x = a->x + r * DIM;",
            "const float *restrict c = a->cos + (r % NPOS) * DIM;",
            "const float *restrict s = a->sin + (r % NPOS) * DIM;",
            "float *restrict y = a->y + r * DIM;",
            "long j = 0;",
            f"#pragma GCC unroll {s.unroll}",
            f"for (; j + {width} <= HALF; j += {width}) {{"]
    for v in range(s.vec):
        body += ["  " + line for line in _step(f"j + {v * lanes}", None)]
    body += ["}", f"for (; j + {lanes} <= HALF; j += {lanes})"]
    body += ["  " + line for line in _step("j", None)]
    body += ["if (j < HALF) {", "  const int n = (int)(HALF - j);"]
    body += ["  " + line for line in _step("j", "n")]
    body.append("}")
    return ("static void row_block1(const row_args *restrict a, long r) {\n"
            + "".join(f"  {line}\n" for line in body) + "}\n")


def emit_rotary(op: OpSignature, s: RotarySchedule, d: IsaDialect) -> str:
    """The C translation unit for the rotary ``op`` under ``s`` (validated by the caller)."""
    dims = {"M": op.dim("M"), "DIM": op.dim("D"), "NPOS": op.dim("S"), "HALF": op.dim("D") // 2}
    consts = "".join(f"#define {k} {v}L\n" for k, v in dims.items())
    setup = ("  row_args a = {(const float *)args[0], (const float *)args[1], "
             "(const float *)args[2], (float *)args[3]};\n")
    return "\n".join([
        d.prelude, HEADER, consts, WORKSPACE,
        "typedef struct { const float *x, *cos, *sin; float *y; } row_args;\n",
        _row(s, d.lanes), row_entries(1, s.threads, setup), TIMER,
    ])


KIND = register(OpKind(
    name="rotary",
    spec=KindSpec(dims=("M", "D", "S"), attrs={}, epilogues=(), check=_signature_problems),
    arguments=_arguments,
    flops=_flops,
    schedule=RotarySchedule,
    problems=rotary_problems,
    default_schedule=default_rotary_schedule,
    emit=emit_rotary,
    reference=_reference,
    reduction_length=lambda op: 1,
    dim_columns={"M": "dim_m", "D": "dim_d", "S": "dim_seq"},
    baseline="numpy",
    tolerance=_tolerance,
    random_inputs=_random_inputs,
    examples=(
        "rotary(M=4096,D=128,S=128)",  # Llama-7B: 32 heads x 128 positions
        "rotary(M=384,D=64,S=32)",  # a small decoder, batch 1
        "rotary(M=30,D=10,S=5)",  # a half-row below the lanes, rows not a power of two
    ),
))
