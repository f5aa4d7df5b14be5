"""The ``layernorm`` kind: each row of ``X[M,N]`` normalised over its ``N`` columns, then scaled.

With ``z`` the row (``X + R`` when ``residual=yes``) and ``eps`` a runtime float (the
1-element input ``eps``; floats are never part of the signature):

* ``norm=layer`` (ONNX ``LayerNormalization`` over the last axis):
  ``y = (z - mean z) / sqrt(var z + eps) * gamma + beta``, ``var`` the population variance;
* ``norm=rms`` (RMSNorm): ``y = z / sqrt(mean z**2 + eps) * gamma + beta``.

``affine`` picks the per-column scale and shift: ``gamma_beta`` (``gamma[N]`` and
``beta[N]``, ONNX's scale and B), ``gamma`` (no shift: ONNX without B, and RMSNorm as LLaMA
uses it) or ``none``. ``residual=yes`` adds ``R[M,N]`` to ``X`` first (BERT's post-norm
``Add`` + ``LayerNormalization``; the sum itself is not an output). Arguments: ``X``, then
``R``, ``gamma``, ``beta`` when used, ``eps[1]``, then ``Y[M,N]``.

Schedule (:class:`LayernormSchedule`, the knobs of :mod:`tunecache.compiler.kinds.rowwise`):
``passes=2`` takes the sum and the sum of squares in one sweep, of ``d = z - z[0]`` (shifted
by the row's first element, so ``var = E[d**2] - E[d]**2`` does not cancel when
``|mean| >> std``, as ONNX Runtime's ``E[z**2] - mean**2`` does), then writes the output;
``passes=3`` takes the mean, then the centred sum of squares, then writes. ``norm=rms``
needs one statistics sweep: ``passes=2``. With ``residual=yes`` the first sweep stores
``X + R`` in ``Y`` and the later ones read it from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import OpKind, register
from tunecache.compiler.kinds.rowwise import (
    RowSchedule,
    default_shape,
    row_problems,
    sweep,
    translation_unit,
    tree,
    vector_names,
)
from tunecache.compiler.ops import KindSpec, OpSignature, TensorArg

__all__ = ["LayernormSchedule", "layernorm_op"]

NORMS = ("layer", "rms")
AFFINES = ("gamma_beta", "gamma", "none")


@dataclass(frozen=True, slots=True)
class LayernormSchedule(RowSchedule):
    """Knobs of a layernorm kernel (see the module docstring and ``rowwise.RowSchedule``)."""

    family: ClassVar[str] = "layernorm"

    passes: int = 2


def layernorm_op(M: int, N: int, *, norm: str = "layer", affine: str | None = None,
                 residual: bool = False, dtype: str = "float32") -> OpSignature:
    """Normalise the rows of ``X[M,N]``; ``affine`` defaults to ``gamma_beta`` for
    ``norm=layer`` and ``gamma`` for ``norm=rms``."""
    if affine is None:
        affine = "gamma" if norm == "rms" else "gamma_beta"
    return OpSignature(
        KIND.name, (("M", M), ("N", N)), dtype,
        (("norm", norm), ("affine", affine), ("residual", "yes" if residual else "no")), (),
    )


def _has_gamma(op: OpSignature) -> bool:
    return op.attr("affine") != "none"


def _has_beta(op: OpSignature) -> bool:
    return op.attr("affine") == "gamma_beta"


def _residual(op: OpSignature) -> bool:
    return op.attr("residual") == "yes"


def _arguments(op: OpSignature) -> tuple[TensorArg, ...]:
    m, n = op.dim("M"), op.dim("N")
    args = [TensorArg("X", (m, n), "input")]
    if _residual(op):
        args.append(TensorArg("R", (m, n), "input"))
    if _has_gamma(op):
        args.append(TensorArg("gamma", (n,), "input"))
    if _has_beta(op):
        args.append(TensorArg("beta", (n,), "input"))
    args += [TensorArg("eps", (1,), "input"), TensorArg("Y", (m, n), "output")]
    return tuple(args)


def _flops(op: OpSignature) -> int:
    """Per element: the sum (layer only), the square-accumulate (2), the normalisation (2 for
    layer: centre and scale; 1 for rms), plus gamma, beta and the residual add if present."""
    per = (5 if op.attr("norm") == "layer" else 3) + _has_gamma(op) + _has_beta(op) \
        + _residual(op)
    return per * op.dim("M") * op.dim("N")


def _unpack(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> dict[str, np.ndarray]:
    return {arg.name: array for arg, array in zip(op.arguments(), inputs, strict=False)}


def _normalise(op: OpSignature, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The rows normalised, before gamma and beta: one new array, updated in place (fresh
    temporaries of a large array cost more than the arithmetic)."""
    x = arrays["X"]
    n = op.dim("N")
    if op.attr("norm") == "layer":
        y = np.add(x, arrays["R"]) if _residual(op) else x.copy()
        y -= y.mean(axis=1, keepdims=True)
        z = y
    else:
        z = np.add(x, arrays["R"]) if _residual(op) else x
        y = z if _residual(op) else np.empty_like(x)
    power = np.einsum("ij,ij->i", z, z) / x.dtype.type(n)
    rstd = 1 / np.sqrt(power + arrays["eps"][0])
    return np.multiply(z, rstd[:, None], out=y)


def _reference(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """The op in numpy, in the inputs' dtype (also the float32 fallback and baseline)."""
    arrays = _unpack(op, inputs)
    y = _normalise(op, arrays)
    if _has_gamma(op):
        y *= arrays["gamma"]
    if _has_beta(op):
        y += arrays["beta"]
    return y


def _tolerance(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> tuple[float, float]:
    """A few float32 ulps of the largest term of ``y``: ``|gamma| * |normalised z|`` and
    ``|beta|`` (the statistics are sums of N terms in vector partial sums)."""
    arrays = _unpack(op, tuple(a.astype(np.float64) for a in inputs))
    top = float(np.abs(_normalise(op, arrays)).max()) if arrays["X"].size else 0.0
    if _has_gamma(op):
        top *= float(np.abs(arrays["gamma"]).max())
    if _has_beta(op):
        top += float(np.abs(arrays["beta"]).max())
    return 1e-5, 2e-5 * top + 1e-6


# -- code generation --------------------------------------------------------------------------


class _Rows:
    """C fragments for rows ``r0 + k`` of a block."""

    def __init__(self, op: OpSignature, lanes: int) -> None:
        self.lanes = lanes
        self.layer = op.attr("norm") == "layer"
        self.gamma = _has_gamma(op)
        self.beta = _has_beta(op)
        self.residual = _residual(op)

    def setup(self, k: int) -> list[str]:
        out = [f"const float *restrict x{k} = a->x + (r0 + {k}) * N;",
               f"float *restrict y{k} = a->y + (r0 + {k}) * N;"]
        if self.residual:
            out.append(f"const float *restrict res{k} = a->r + (r0 + {k}) * N;")
        return out

    def first(self, k: int, j: str) -> str:
        """``z`` at column ``j`` in the first sweep (``X + R`` with a residual)."""
        if self.residual:
            return f"VADD(VLOADU(x{k} + {j}), VLOADU(res{k} + {j}))"
        return f"VLOADU(x{k} + {j})"

    def first_part(self, k: int, j: str) -> str:
        if self.residual:
            return f"VADD(VLOADU_PART(x{k} + {j}, n), VLOADU_PART(res{k} + {j}, n))"
        return f"VLOADU_PART(x{k} + {j}, n)"

    def src(self, k: int) -> str:
        """Where later sweeps read ``z``: Y (the first stored ``X + R`` there) or X."""
        return f"y{k}" if self.residual else f"x{k}"

    def affine(self, t: str, v: str) -> str:
        """``t * gamma + beta`` with the shared vectors ``g{v}``, ``b{v}``."""
        if self.beta:
            return f"VFMA({t}, g{v}, b{v})"
        if self.gamma:
            return f"VMUL({t}, g{v})"
        return t

    def normalise(self, z: str, k: int) -> str:
        # (z - mean) * rstd, not z * rstd - mean * rstd: the subtraction is exact when z is
        # close to the mean, where rstd may be as large as 1/sqrt(eps).
        return f"VMUL(VSUB({z}, vm{k}), va{k})" if self.layer else f"VMUL({z}, va{k})"


def _stats(r: _Rows, k_rows: int, s: LayernormSchedule) -> list[str]:
    """Sweeps for ``mean{k}`` (layer) and ``power{k}`` (the variance, or mean z**2 for rms).

    One sweep for both sums (layer, ``passes=2``) accumulates ``d = z - z[0]``: shifting by
    any element of the row keeps ``E[d**2] - E[d]**2`` free of the cancellation that
    ``E[z**2] - mean**2`` suffers when ``|mean| >> std``.
    """
    lanes, vec = r.lanes, s.vec
    sums = r.layer
    squares = not (r.layer and s.passes == 3)
    shifted = sums and squares
    lengths = ["N"] * k_rows
    out: list[str] = []
    for k in range(k_rows):
        names = (vector_names("s", k, vec) if sums else []) + \
            (vector_names("q", k, vec) if squares else [])
        out.append("vec " + ", ".join(f"{a} = VZERO()" for a in names) + ";")
        if shifted:
            first = f"x{k}[0] + res{k}[0]" if r.residual else f"x{k}[0]"
            out += [f"const float shift{k} = {first};", f"const vec vk{k} = VSET1(shift{k});"]

    def accumulate(k: int, v: int, z: str, store: str, partial: bool) -> str:
        lines = [f"const vec z = {z};", store]
        d = "z"
        if shifted:
            d = f"VFILL_PART(VSUB(z, vk{k}), n, 0.0f)" if partial else f"VSUB(z, vk{k})"
            lines.append(f"const vec d = {d};")
            d = "d"
        if sums:
            lines.append(f"s{k}_{v} = VADD(s{k}_{v}, {d});")
        if squares:
            lines.append(f"q{k}_{v} = VFMA({d}, {d}, q{k}_{v});")
        return "{ " + " ".join(line for line in lines if line) + " }"

    def step(k: int, j: str, nv: int) -> list[str]:
        return [accumulate(k, v, r.first(k, f"{j} + {v * lanes}"),
                           f"VSTOREU(y{k} + {j} + {v * lanes}, z);" if r.residual else "", False)
                for v in range(nv)]

    def part(k: int, j: str) -> list[str]:
        return [accumulate(k, 0, r.first_part(k, j),
                           f"VSTOREU_PART(y{k} + {j}, z, n);" if r.residual else "", True)]

    out += sweep(k_rows, vec, s.unroll, lanes, lengths, step, part)
    for k in range(k_rows):
        total = f"VHSUM({tree('VADD', vector_names('s', k, vec))}) / (float)N"
        power = f"VHSUM({tree('VADD', vector_names('q', k, vec))}) / (float)N"
        if shifted:
            # The variance may still round below zero for a (nearly) constant row.
            out += [f"const float dmean{k} = {total};",
                    f"const float mean{k} = shift{k} + dmean{k};",
                    f"float power{k} = {power} - dmean{k} * dmean{k};",
                    f"if (power{k} < 0.0f) power{k} = 0.0f;"]
        elif sums:
            out.append(f"const float mean{k} = {total};")
        else:
            out.append(f"const float power{k} = {power};")
    if squares:
        return out
    for k in range(k_rows):
        out.append(f"const vec vm{k} = VSET1(mean{k});")
        out.append("vec " + ", ".join(f"{a} = VZERO()" for a in vector_names("q", k, vec)) + ";")

    def centred(k: int, j: str, nv: int) -> list[str]:
        return [f"{{ const vec d = VSUB(VLOADU({r.src(k)} + {j} + {v * lanes}), vm{k}); "
                f"q{k}_{v} = VFMA(d, d, q{k}_{v}); }}" for v in range(nv)]

    def centred_part(k: int, j: str) -> list[str]:
        return [f"const vec d = VFILL_PART(VSUB(VLOADU_PART({r.src(k)} + {j}, n), vm{k}), n, 0.0f);",
                f"q{k}_0 = VFMA(d, d, q{k}_0);"]

    out += sweep(k_rows, vec, s.unroll, lanes, lengths, centred, centred_part)
    for k in range(k_rows):
        out.append(f"const float power{k} = "
                   f"VHSUM({tree('VADD', vector_names('q', k, vec))}) / (float)N;")
    return out


def _output(r: _Rows, k_rows: int, s: LayernormSchedule) -> list[str]:
    lanes = r.lanes
    out: list[str] = []
    for k in range(k_rows):
        out.append(f"const float rstd{k} = 1.0f / __builtin_sqrtf(power{k} + a->eps);")
        out.append(f"const vec va{k} = VSET1(rstd{k});")
        if r.layer and s.passes == 2:  # 3 passes: the centred sweep set it
            out.append(f"const vec vm{k} = VSET1(mean{k});")

    def shared(j: str, nv: int) -> list[str]:
        lines = []
        for v in range(nv):
            if r.gamma:
                lines.append(f"const vec g{v} = VLOADU(a->gamma + {j} + {v * lanes});")
            if r.beta:
                lines.append(f"const vec b{v} = VLOADU(a->beta + {j} + {v * lanes});")
        return lines

    def step(k: int, j: str, nv: int) -> list[str]:
        return [f"VSTOREU(y{k} + {j} + {v * lanes}, "
                f"{r.affine(r.normalise(f'VLOADU({r.src(k)} + {j} + {v * lanes})', k), str(v))});"
                for v in range(nv)]

    def part(k: int, j: str) -> list[str]:
        lines = []
        if r.gamma:
            lines.append(f"const vec g0 = VLOADU_PART(a->gamma + {j}, n);")
        if r.beta:
            lines.append(f"const vec b0 = VLOADU_PART(a->beta + {j}, n);")
        t = r.normalise(f"VLOADU_PART({r.src(k)} + {j}, n)", k)
        return [*lines, f"VSTOREU_PART(y{k} + {j}, {r.affine(t, '0')}, n);"]

    out += sweep(k_rows, s.vec, s.unroll, lanes, ["N"] * k_rows, step, part,
                 shared if r.gamma else None)
    return out


def _block(r: _Rows, k_rows: int, s: LayernormSchedule) -> str:
    """``row_block{k_rows}``: rows ``r0 .. r0 + k_rows - 1``."""
    body: list[str] = []
    for k in range(k_rows):
        body += r.setup(k)
    body += _stats(r, k_rows, s) + _output(r, k_rows, s)
    return (f"static void row_block{k_rows}(const row_args *restrict a, long r0) {{\n"
            + "".join(f"  {line}\n" for line in body) + "}\n")


def generate_layernorm(op: OpSignature, s: LayernormSchedule, d: IsaDialect) -> str:
    """The C translation unit for the layernorm ``op`` under ``s`` (validated by the caller)."""
    r = _Rows(op, d.lanes)
    names = [a.name for a in op.arguments()]

    def arg(name: str) -> str:
        return f"(const float *)args[{names.index(name)}]" if name in names else "NULL"

    setup = (f"  row_args a = {{{arg('X')}, {arg('R')}, {arg('gamma')}, {arg('beta')}, "
             f"(float *)args[{len(names) - 1}], ({arg('eps')})[0]}};\n")
    return translation_unit(
        d.prelude, {"M": op.dim("M"), "N": op.dim("N")},
        "const float *x, *r, *gamma, *beta; float *y; float eps;",
        lambda rows: _block(r, rows, s), s, setup)


def layernorm_problems(op: OpSignature, s: LayernormSchedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``s`` is illegal for the layernorm ``op`` on ``hw`` (empty when legal)."""
    return row_problems(op, s, hw, (2, 3) if op.attr("norm") == "layer" else (2,))


def default_layernorm_schedule(op: OpSignature, hw: HardwareSpec,
                               threads: int = 1) -> LayernormSchedule:
    """The (vec, rows) of :func:`~tunecache.compiler.kinds.rowwise.default_shape`, the
    statistics in one (shifted) sweep: 10-20% faster than the centred two (AVX2, N=768)."""
    vec, rows = default_shape(op, hw)
    return LayernormSchedule(vec=vec, rows=rows, passes=2, threads=threads)


def _random_inputs(op: OpSignature, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Standard normal tensors and the usual epsilon (a negative one would give NaN)."""
    return tuple(
        np.full(arg.shape, 1e-5, np.float32) if arg.name == "eps"
        else rng.standard_normal(arg.shape, dtype=np.float32)
        for arg in _arguments(op) if arg.role == "input")


KIND = register(OpKind(
    name="layernorm",
    spec=KindSpec(
        dims=("M", "N"),
        attrs={"norm": NORMS, "affine": AFFINES, "residual": ("no", "yes")},
        epilogues=(),
    ),
    arguments=_arguments,
    flops=_flops,
    schedule=LayernormSchedule,
    problems=layernorm_problems,
    default_schedule=default_layernorm_schedule,
    emit=generate_layernorm,
    reference=_reference,
    reduction_length=lambda op: op.dim("N"),
    dim_columns={"M": "dim_m", "N": "dim_n"},
    baseline="numpy",
    tolerance=_tolerance,
    random_inputs=_random_inputs,
    examples=("layernorm(M=128,N=768)", "layernorm(M=384,N=768,residual=yes)",
              "layernorm(M=37,N=4096,norm=rms,affine=gamma)"),
))
