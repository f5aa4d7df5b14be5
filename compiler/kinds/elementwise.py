"""The ``elementwise`` kind: a fused chain of element-wise steps, ``Y[M,N] = chain(X[M,N])``.

Design:

* dims ``M, N``: the tensor seen as ``M`` rows of ``N`` contiguous floats (a caller flattens
  its shape so that broadcast operands line up: e.g. NCHW with a per-channel operand is
  ``M = N*C`` rows of ``N = H*W``).
* the steps are the op's ``epilogue``, a chain (any order, repeats allowed:
  ``KindSpec.epilogue_chain``) from a fixed vocabulary: binary ``add, sub, mul, div, max,
  min`` (``v = v op B``, each consuming the next extra operand ``B1, B2, ...``), ``prelu``
  (``v > 0 ? v : v*B``: PRelu, LeakyRelu) and ``elu`` (``v > 0 ? v : B*(e**v - 1)``), and
  unary ``relu, sigmoid, tanh, gelu_erf, gelu_tanh, silu, exp, neg, abs, sqrt, clip6, erf,
  qround, hardswish, hardsigmoid, mish, softplus`` (``clip6`` is ReLU6, ``min(max(v, 0),
  6)``; ``qround`` a quantizer's rounding,
  :data:`~tunecache.compiler.codegen.epilogue.QROUND_LIMIT`). An empty chain copies X
  (``epilogue=none``). A quantize-dequantize pair with scale ``s`` and zero point ``z`` over
  ``[lo, hi]`` is ``div s, max lo-z, min hi-z, qround, mul s``.
* attribute ``operand``: how every extra operand broadcasts: ``full`` (``[M,N]``), ``row``
  (``[N]``, one value per column, like a bias), ``col`` (``[M]``, one value per row) or
  ``scalar`` (``[1]``), or ``col8`` / ``col16`` (``[M*x]``: element ``(r, j)`` reads
  ``B[r*x + j mod x]``, a per-channel operand of an ``nchw{x}c`` tensor seen as ``N*C/x``
  rows of ``H*W*x``: squeeze-excitation gates on blocked activations). A chain without
  binary steps must say ``full`` (one text per computation). Operands broadcasting
  differently are separate ops (split the chain).
* at most :data:`MAX_STEPS` steps. Float constants (a scale, a clip bound other than 6) are
  runtime operands (``scalar``), so the signature stays integer.

Accuracy: float32 throughout; ``exp`` saturates at e**88 (the ISA's ``VEXP``), ``tanh``
and the erf in ``gelu_erf`` are polynomials within about 2e-7; ``sqrt`` of a negative is NaN,
as in numpy.

Kernels stream X, the full/row operands and Y once with contiguous vector loads (``vec``
vectors per step, the step loop unrolled ``unroll`` times), the chain held in registers
(``chain()``, one C statement per step from :func:`step_c`'s table; ``relu``, ``clip6`` and
``silu`` are the fused epilogue steps of :mod:`tunecache.compiler.codegen.epilogue`, defined
there once for every kind). A thread walks its flat
range in whole vectors: within a row a row operand is a pointer running along and a col
operand one broadcast value; a vector crossing rows (every vector when ``N`` is below the
lanes) gathers its operand lanes one by one; full and scalar operands need no rows at all.
Only the thread's last vector may be partial (masked loads and stores). ``nt=1`` writes Y
with non-temporal stores after one partial vector that aligns the range, saving the
read-for-ownership traffic when Y misses the cache (about 1.8x on a 64 MiB copy here).
Threads split the flat range in pieces of 16 floats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy import special

from tunecache.compiler.codegen.abi import HEADER, TIMER, WORKSPACE, parallel_entry
from tunecache.compiler.codegen.epilogue import CHAIN_STEPS
from tunecache.compiler.codegen.epilogue import STEPS as EPILOGUE_STEPS
from tunecache.compiler.codegen.isa import SCALAR_MATH, IsaDialect
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import ChainView, OpKind, register
from tunecache.compiler.kinds.layouts import BLOCKED, NCHW, channel_block
from tunecache.compiler.ops import KindSpec, OpSignature, TensorArg
from tunecache.compiler.schedule import ScheduleData, threads_problem

__all__ = ["BINARY_STEPS", "OPERANDS", "UNARY_STEPS", "ElementwiseSchedule", "elementwise_op",
           "step_c"]

BINARY_STEPS = ("add", "sub", "mul", "div", "max", "min", "prelu", "elu")
UNARY_STEPS = ("relu", "sigmoid", "tanh", "gelu_erf", "gelu_tanh", "silu", "exp", "neg", "abs",
               "sqrt", "clip6", "erf", "qround", "hardswish", "hardsigmoid", "mish", "softplus")
OPERANDS = ("full", "row", "col", "scalar", *(f"col{channel_block(b)}" for b in BLOCKED))
MAX_STEPS = 16
_SHARED = tuple(step for step in UNARY_STEPS if step in EPILOGUE_STEPS)
"""Unary steps that are conv/matmul epilogue steps too: their C and numpy come from there."""
VEC_CHOICES = (1, 2, 4)
UNROLL_CHOICES = (1, 2, 4)
_CHUNK = 16  # floats per piece of a thread's range: one 64-byte line


@dataclass(frozen=True, slots=True)
class ElementwiseSchedule(ScheduleData):
    """Knobs of an elementwise kernel: ``vec`` vectors per step, ``unroll`` of the step
    loop, ``nt`` non-temporal stores of Y (0/1), ``threads``."""

    family: ClassVar[str] = "elementwise"

    vec: int = 2
    unroll: int = 1
    nt: int = 0
    threads: int = 1

    def __str__(self) -> str:
        return f"v{self.vec} u{self.unroll} nt{self.nt} t{self.threads}"


def elementwise_op(M: int, N: int, steps: tuple[str, ...] | str = (), *, operand: str = "full",
                   dtype: str = "float32") -> OpSignature:
    """``Y[M,N] = chain(X)``; ``steps`` as a tuple or ``'+'``-joined text."""
    chain = (() if steps in ("", "none") else tuple(steps.split("+"))) \
        if isinstance(steps, str) else tuple(steps)
    return OpSignature(KIND.name, (("M", M), ("N", N)), dtype, (("operand", operand),), chain)


def binary_count(op: OpSignature) -> int:
    """Extra operands: one per binary step."""
    return sum(step in BINARY_STEPS for step in op.epilogue)


def operand_block(op: OpSignature) -> int:
    """``x`` of a ``col{x}`` operand (a per-channel operand of blocked rows), else 0."""
    mode = op.attr("operand")
    return int(mode[3:]) if mode.startswith("col") and mode != "col" else 0


def _chain_view(op: OpSignature) -> ChainView | None:
    """``OpKind.chain_view``: a float32 chain of the steps a producer's epilogue can take
    (:data:`~tunecache.compiler.codegen.epilogue.CHAIN_STEPS`) with ``scalar``, ``row`` or
    ``col`` operands (or none), or a residual: ``add`` of a ``full`` operand, then unary
    steps."""
    mode = op.attr("operand")
    residual = mode == "full" and binary_count(op) == 1 and op.epilogue[0] == "add"
    if op.dtype != "float32" or not op.epilogue or \
            any(step not in CHAIN_STEPS for step in op.epilogue) or \
            (mode not in ("scalar", "row", "col") and binary_count(op) and not residual):
        return None
    return ChainView(op.dim("M"), op.dim("N"), op.attr("operand"), op.epilogue)


def _signature_problems(op: OpSignature) -> list[str]:
    found = []
    x = operand_block(op)
    if x and op.dim("N") % x:
        found.append(f"operand={op.attr('operand')} needs N a multiple of {x} (rows of whole "
                     f"{x}-channel pixels); got N={op.dim('N')}")
    if len(op.epilogue) > MAX_STEPS:
        found.append(f"{len(op.epilogue)} steps; at most {MAX_STEPS} (split the chain)")
    if not binary_count(op) and op.attr("operand") != OPERANDS[0]:
        found.append(f"operand={op.attr('operand')} has no effect without a binary step "
                     f"({', '.join(BINARY_STEPS)}); use operand={OPERANDS[0]}")
    return found


def _operand_shape(op: OpSignature) -> tuple[int, ...]:
    M, N = op.dim("M"), op.dim("N")
    if operand_block(op):
        return (M * operand_block(op),)
    return {"full": (M, N), "row": (N,), "col": (M,), "scalar": (1,)}[op.attr("operand")]


def _arguments(op: OpSignature) -> tuple[TensorArg, ...]:
    M, N = op.dim("M"), op.dim("N")
    shape = _operand_shape(op)
    extra = tuple(TensorArg(f"B{i + 1}", shape, "input") for i in range(binary_count(op)))
    return (TensorArg("X", (M, N), "input"), *extra, TensorArg("Y", (M, N), "output"))


def _flops(op: OpSignature) -> int:
    # A plain copy counts one per element, so rates and intensities stay defined.
    return op.dim("M") * op.dim("N") * max(1, len(op.epilogue))


# -- reference ------------------------------------------------------------------------------

_UNARY_NP: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    **{step: EPILOGUE_STEPS[step].numpy for step in _SHARED},
    "sigmoid": lambda v: special.expit(v, out=v),
    "tanh": lambda v: np.tanh(v, out=v),
    "exp": lambda v: np.exp(v, out=v),
    "neg": lambda v: np.negative(v, out=v),
    "abs": lambda v: np.abs(v, out=v),
    "sqrt": lambda v: np.sqrt(v, out=v),
    "erf": lambda v: special.erf(v, out=v),
    "softplus": lambda v: np.logaddexp(v.dtype.type(0), v, out=v),
}


def _prelu(v: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.multiply(v, np.where(v > 0, v.dtype.type(1), b), out=out)


def _elu(v: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    out[...] = np.where(v > 0, v, b * np.expm1(v))
    return out


_BINARY_NP: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "max": np.maximum, "min": np.minimum, "prelu": _prelu, "elu": _elu,
}


def _run_chain(op: OpSignature, inputs: tuple[np.ndarray, ...],
               track: Callable[[np.ndarray], None] | None = None) -> np.ndarray:
    """The chain over X in the inputs' dtype, in place on one copy; ``track`` sees every
    intermediate value."""
    M, N = op.dim("M"), op.dim("N")
    v = np.array(inputs[0], copy=True).reshape(M, N)
    operands = iter(inputs[1:])
    col = op.attr("operand") == "col"
    x = operand_block(op)
    with np.errstate(all="ignore"):
        for step in op.epilogue:
            if step in _BINARY_NP:
                b = next(operands)
                if x:
                    pixels = v.reshape(M, N // x, x)
                    _BINARY_NP[step](pixels, b.reshape(M, 1, x), out=pixels)
                else:
                    _BINARY_NP[step](v, b.reshape(M, 1) if col else b, out=v)
            else:
                v = _UNARY_NP[step](v)
            if track is not None:
                track(v)
    return v


def _reference(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """The chain in numpy, in the inputs' dtype (one pass per step)."""
    return _run_chain(op, inputs)


def _random_inputs(op: OpSignature, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """X standard normal; operands of magnitude 0.5..2 with random signs, so ``div`` stays
    well conditioned. A chain with ``sqrt`` gets positive data instead (X = |normal| + 0.1,
    positive operands), which keeps it real unless a ``sub`` or ``neg`` turns it negative."""
    args = [a for a in op.arguments() if a.role == "input"]
    positive = "sqrt" in op.epilogue
    x = rng.standard_normal(args[0].shape, dtype=np.float32)
    if positive:
        x = np.abs(x) + np.float32(0.1)
    operands = []
    for arg in args[1:]:
        b = rng.uniform(0.5, 2.0, arg.shape).astype(np.float32)
        if not positive:
            b *= rng.choice(np.array([-1.0, 1.0], dtype=np.float32), arg.shape)
        operands.append(b)
    return (x, *operands)


def _tolerance(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> tuple[float, float]:
    # Each float32 step errs by a few ulp of its result; cancellation in a later add or sub
    # turns that into an absolute error of the largest intermediate's size.
    largest = [float(np.abs(inputs[0]).max(initial=0.0))]

    def track(v: np.ndarray) -> None:
        finite = v[np.isfinite(v)]
        largest.append(float(np.abs(finite).max(initial=0.0)))

    _run_chain(op, tuple(x.astype(np.float64) for x in inputs), track)
    return 2e-5, 1e-6 * (1.0 + max(largest))


# -- C: one vector step ---------------------------------------------------------------------

_UNARY_C = {
    **{step: EPILOGUE_STEPS[step].vector.format(x="u", y="") for step in _SHARED},
    "sigmoid": "VDIV(VSET1(1.0f), VADD(VSET1(1.0f), VEXP(VNEG(u))))",
    "tanh": "VTANH(u)",
    "exp": "VEXP(u)",
    "neg": "VNEG(u)",
    "abs": "VABS(u)",
    "sqrt": "VSQRT(u)",
    "erf": "VERF(u)",
    # max(u, 0) + ln(1 + e**-|u|): no overflow; VLOG's argument lies in [1, 2].
    "softplus": "VADD(VMAX(VZERO(), u), VLOG(VADD(VSET1(1.0f), VEXP(VNEG(VABS(u))))))",
}
_BINARY_C = {"add": "VADD(u, b)", "sub": "VSUB(u, b)", "mul": "VMUL(u, b)", "div": "VDIV(u, b)",
             # Only a quantize step clamps (ONNX Max/Min run elsewhere): NaN takes the low
             # end, as onnxruntime's QuantizeLinear maps it (VMAX returns b on NaN).
             "max": "VMAX(u, b)", "min": "VMIN(u, b)",
             # PRelu and LeakyRelu (b the slope), Elu (b its alpha); NaN stays NaN.
             "prelu": "VSEL_LT(VZERO(), u, u, VMUL(u, b))",
             "elu": "VSEL_LT(VZERO(), u, u, VMUL(b, VSUB(VEXP(u), VSET1(1.0f))))"}


def step_c(step: str, value: str, operand: str | None = None) -> str:
    """C statement applying ``step`` to the ``vec`` variable ``value`` in place; a binary
    step combines it with the ``vec`` expression ``operand``."""
    if step in _BINARY_C:
        if operand is None:
            raise ValueError(f"binary step {step!r} needs an operand")
        return f"{{ vec u = {value}, b = {operand}; {value} = {_BINARY_C[step]}; }}"
    template = _UNARY_C.get(step)
    if template is None:
        raise ValueError(f"unknown elementwise step {step!r}; expected one of "
                         f"{', '.join(BINARY_STEPS + UNARY_STEPS)}")
    return f"{{ vec u = {value}; {value} = {template}; }}"


# -- schedules ------------------------------------------------------------------------------


def elementwise_problems(op: OpSignature, s: ElementwiseSchedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``s`` is illegal for the elementwise ``op`` on ``hw`` (empty when legal)."""
    found: list[str] = []
    if s.vec not in VEC_CHOICES:
        found.append(f"vec={s.vec}; expected one of {', '.join(map(str, VEC_CHOICES))}")
    if s.unroll not in UNROLL_CHOICES:
        found.append(f"unroll={s.unroll}; expected one of {', '.join(map(str, UNROLL_CHOICES))}")
    if s.nt not in (0, 1):
        found.append(f"nt={s.nt} must be 0 or 1")
    elif s.nt and operand_block(op):
        found.append(f"nt=1 does not apply to operand={op.attr('operand')} (its vectors must "
                     "start on whole pixels); use nt=0")
    found += threads_problem(s.threads, hw)
    return found


def default_elementwise_schedule(op: OpSignature, hw: HardwareSpec,
                                 threads: int = 1) -> ElementwiseSchedule:
    """Two vectors per step (one for short rows of a row/col operand), non-temporal stores
    once Y is larger than the last-level cache."""
    segmented = binary_count(op) and op.attr("operand") in ("row", "col")
    vec = 1 if segmented and op.dim("N") < 2 * hw.lanes else 2
    big = (op.dim("M") * op.dim("N") * op.dtype_bytes > hw.l3_bytes
           and not operand_block(op))
    return ElementwiseSchedule(vec=vec, nt=int(big), threads=threads)


# -- C emitter ------------------------------------------------------------------------------


def _chain_function(op: OpSignature) -> str:
    """``chain(a, b1, b2, ...)``: the steps on one vector, binary steps taking ``b1, ...``."""
    params = "".join(f", vec b{i}" for i in range(1, binary_count(op) + 1))
    lines = []
    binary = 0
    for step in op.epilogue:
        binary += step in BINARY_STEPS
        lines.append("  " + step_c(step, "a", f"b{binary}" if step in BINARY_STEPS else None))
    return (f"static inline vec chain(vec a{params}) {{\n" + "".join(f"{line}\n" for line in lines)
            + "  return a;\n}\n")


def _emit_vectors(op: OpSignature, s: ElementwiseSchedule, lanes: int) -> str:
    """``run_vectors(x, y, count, operands)``: ``count`` (a multiple of the lanes) contiguous
    elements; each operand a pointer running along (full, row) or a broadcast vector."""
    count = binary_count(op)
    blocked = bool(operand_block(op))
    pointers = op.attr("operand") in ("full", "row") or blocked
    params = "".join(f", const float *restrict b{i}" if pointers else f", vec b{i}"
                     for i in range(1, count + 1))

    def operands(offset: str) -> str:
        # A col{x} operand repeats every x elements of its row (runs start on a pixel).
        index = f"({offset}) % XB" if blocked else offset
        return "".join(f", VLOADU(b{i} + {index})" if pointers else f", b{i}"
                       for i in range(1, count + 1))

    store = "VSTREAM" if s.nt else "VSTOREU"
    step = s.vec * lanes
    loads = " ".join(f"vec a{v} = VLOADU(x + k + {v * lanes});" for v in range(s.vec))
    chains = " ".join(f"a{v} = chain(a{v}{operands(f'k + {v * lanes}')});" for v in range(s.vec))
    stores = " ".join(f"{store}(y + k + {v * lanes}, a{v});" for v in range(s.vec))
    return f"""\
static inline void run_vectors(const float *restrict x, float *restrict y, long count{params}) {{
  long k = 0;
  #pragma GCC unroll {s.unroll}
  for (; k + {step} <= count; k += {step}) {{
    {loads}
    {chains}
    {stores}
  }}
  for (; k < count; k += LANES) {store}(y + k, chain(VLOADU(x + k){operands("k")}));
}}
"""


def _gather(op: OpSignature) -> str:
    """``operand_at(B, pos, n)``: the operand values of flat elements ``pos .. pos+n-1`` (the
    lanes of a vector that may cross rows)."""
    index = {"row": "(pos + l) % NCOLS", "col": "(pos + l) / NCOLS"}.get(
        op.attr("operand"), "(pos + l) / NCOLS * XB + (pos + l) % XB")
    return f"""\
static inline vec operand_at(const float *b, long pos, int n) {{
  float t[LANES];
  for (int l = 0; l < LANES; l++) t[l] = l < n ? b[{index}] : 0.0f;
  return VLOADU(t);
}}
"""


def _emit_range(op: OpSignature, s: ElementwiseSchedule) -> str:
    """``run_range(args, lo, hi)``: flat elements ``[lo, hi)`` as whole vectors at aligned
    positions of Y (with ``nt``; after one partial head vector) and one partial tail."""
    count = binary_count(op)
    mode = op.attr("operand") if count else "full"
    numbers = range(1, count + 1)
    decl = "".join(f"  const float *B{i} = (const float *)args[{i}];\n" for i in numbers)
    if mode == "scalar":
        decl += "".join(f"  const vec s{i} = VSET1(B{i}[0]);\n" for i in numbers)
    segmented = mode in ("row", "col") or bool(operand_block(op))

    def at(pos: str, n: str) -> str:
        """Operand vectors of ``n`` (<= lanes) elements from flat position ``pos``."""
        if mode == "full":
            return "".join(f", VLOADU_PART(B{i} + {pos}, {n})" for i in numbers)
        if mode == "scalar":
            return "".join(f", s{i}" for i in numbers)
        return "".join(f", operand_at(B{i}, {pos}, {n})" for i in numbers)

    def partial(pos: str, n: str) -> str:
        return f"VSTOREU_PART(Y + {pos}, chain(VLOADU_PART(X + {pos}, {n}){at(pos, n)}), {n});"

    head = ""
    if s.nt:
        # Streaming stores need aligned addresses: a partial vector first brings Y there.
        head = ("  {\n    const int n = (int)MIN(hi - pos, "
                "(long)(((-(unsigned long)(Y + pos)) / 4) & (LANES - 1)));\n"
                f"    if (n > 0) {{ {partial('pos', 'n')} pos += n; }}\n  }}\n")
    if segmented:
        along = "".join(f", B{i} + j" if mode == "row" else f", B{i} + i * XB"
                        if operand_block(op) else f", VSET1(B{i}[i])" for i in numbers)
        store = "VSTREAM" if s.nt else "VSTOREU"
        body = f"""\
  while (pos < hi) {{
    const long i = pos / NCOLS, j = pos % NCOLS;
    const long run = MIN(NCOLS - j, hi - pos) / LANES * LANES;
    (void)i;
    if (run > 0) {{ run_vectors(X + pos, Y + pos, run{along}); pos += run; }}
    if (pos < hi && (run == 0 || pos % NCOLS != 0)) {{
      /* a vector crossing into the next row(s): operands gathered lane by lane */
      const int n = (int)MIN(LANES, hi - pos);
      if (n == LANES) {store}(Y + pos, chain(VLOADU(X + pos){at("pos", "LANES")}));
      else {partial("pos", "n")}
      pos += n;
    }}
  }}
"""
    else:
        along = "".join(f", B{i} + pos" if mode == "full" else f", s{i}" for i in numbers)
        body = f"""\
  const long run = (hi - pos) / LANES * LANES;
  run_vectors(X + pos, Y + pos, run{along});
  pos += run;
  if (pos < hi) {{ const int n = (int)(hi - pos); {partial("pos", "n")} }}
"""
    fence = "  VSFENCE();\n" if s.nt else ""
    return f"""\
static void run_range(void **args, long lo, long hi) {{
  const float *X = (const float *)args[0];
  float *Y = (float *)args[{count + 1}];
{decl}  long pos = lo;
{head}{body}{fence}}}

static void run_part(void **args, int tid, int nth) {{
  long lo, hi;
  split_range((TOTAL + {_CHUNK} - 1) / {_CHUNK}, tid, nth, &lo, &hi);
  if (lo < hi) run_range(args, lo * {_CHUNK}, MIN(hi * {_CHUNK}, TOTAL));
}}
"""


def emit_elementwise(op: OpSignature, s: ElementwiseSchedule, d: IsaDialect) -> str:
    """The C translation unit for the elementwise ``op`` under ``s`` (validated by the caller)."""
    M, N = op.dim("M"), op.dim("N")
    consts = (f"#define NROWS {M}L\n#define NCOLS {N}L\n#define TOTAL {M * N}L\n"
              f"#define LANES {d.lanes}L\n#define XB {max(1, operand_block(op))}L\n")
    entry = ("int tc_kernel(void **args) {\n"
             + parallel_entry(s.threads, "run_part(args, TID, NTH);", "0"))
    parts = [d.prelude, *_math(op, d), HEADER, consts, WORKSPACE, _chain_function(op),
             _emit_vectors(op, s, d.lanes)]
    if binary_count(op) and (op.attr("operand") in ("row", "col") or operand_block(op)):
        parts.append(_gather(op))
    return "\n".join([*parts, _emit_range(op, s), entry, TIMER])


def _math(op: OpSignature, d: IsaDialect) -> list[str]:
    """The C after the prelude that ``op``'s steps call: ``VLOG`` for softplus, the vector
    helpers of shared epilogue steps (mish's; kernels of this kind are vector-only, so the
    scalar helpers stay out and no other chain's source changes)."""
    helpers = [name for step in op.epilogue if step in _SHARED
               for name in EPILOGUE_STEPS[step].helpers if name.startswith("V")]
    return ([d.log] if "softplus" in op.epilogue else []) + \
        [SCALAR_MATH[name] for name in dict.fromkeys(helpers)]


def _layout_slots(op: OpSignature) -> tuple[str | None, ...]:
    operand = "in" if op.attr("operand") == "full" else None
    return ("in",) + (operand,) * binary_count(op)


def _relayout(op: OpSignature, src: str, dst: str) -> OpSignature | None:
    """The same op on any layout, element for element: X, Y and full operands share one
    layout, whose flat order then does not matter. A column operand (one value per channel
    of an ``[N*C, H*W]`` view) becomes a ``col{x}`` operand of the blocked rows
    ``[N*C/x, H*W*x]`` (the planner blocks only tensors whose channels fill whole blocks); a
    row operand follows the plain view, so it stays on plain tensors."""
    if src != dst:
        return None
    mode = op.attr("operand") if binary_count(op) else "full"
    if src == NCHW or mode in ("full", "scalar"):
        return op
    x = channel_block(src)
    if mode != "col" or op.dim("M") % x:
        return None
    return elementwise_op(op.dim("M") // x, op.dim("N") * x, op.epilogue, operand=f"col{x}",
                          dtype=op.dtype)


KIND = register(OpKind(
    name="elementwise",
    spec=KindSpec(
        dims=("M", "N"),
        attrs={"operand": OPERANDS},
        epilogues=BINARY_STEPS + UNARY_STEPS,
        check=_signature_problems,
        epilogue_chain=True,
    ),
    arguments=_arguments,
    flops=_flops,
    schedule=ElementwiseSchedule,
    problems=elementwise_problems,
    default_schedule=default_elementwise_schedule,
    emit=emit_elementwise,
    reference=_reference,
    reduction_length=lambda op: 1,
    dim_columns={"M": "dim_m", "N": "dim_n"},
    baseline="numpy",
    tolerance=_tolerance,
    random_inputs=_random_inputs,
    layout_slots=_layout_slots,
    relayout=_relayout,
    chain_view=_chain_view,
    examples=(
        "elementwise(M=128,N=3072,operand=row,epilogue=add+gelu_erf)",  # BERT FFN bias + GELU
        "elementwise(M=256,N=3136,operand=full,epilogue=add+relu)",  # ResNet residual add
        "elementwise(M=256,N=3136,operand=col,epilogue=mul+add+relu)",  # folded BatchNorm + ReLU
        "elementwise(M=32,N=12544,operand=full,epilogue=silu)",  # EfficientNet SiLU
        "elementwise(M=96,N=12544,operand=full,epilogue=clip6)",  # MobileNet-v2 ReLU6
    ),
))
