"""The ``softmax`` kind: ``Y[M,N] = softmax(X * scale + mask)`` along ``N``, computed stably.

Rows are the ``M`` axis, the reduced axis ``N`` is the last, contiguous one (attention
scores ``[B*H*S_q, S_k]`` for BERT and GPT-2). Each row ``i``, with ``z = X[i] * scale +
mask row``, is ``exp(z - max z) / sum exp(z - max z)``. The signature:

* ``scale=yes``: multiply by a runtime float, the 1-element input ``scale`` (attention's
  ``1/sqrt(d)``; a float is never part of the signature, so the cache key stays integer).
* ``mask_rows`` (parameter, default 0 = no mask): an additive ``mask[mask_rows, N]``; row
  ``i`` of X adds mask row ``i // (M // mask_rows)``. ``mask_rows=M`` is a full ``[M,N]``
  mask; ``mask_rows=B`` over ``M = B*H*S`` rows is BERT's ``[B,1,1,S]`` padding mask.
  ``mask_rows`` must divide ``M``.
* ``causal=yes`` with the parameter ``Q`` (query rows per block, ``1 <= Q <= N``, ``Q``
  divides ``M``): row ``i`` is query position ``q = i % Q`` and keys ``j > q + (N - Q)`` are
  masked to ``-inf`` (output 0); ``Q = N`` is GPT-2's square causal mask, ``Q < N`` the
  last ``Q`` queries over ``N`` keys (decoding with a key/value cache). ``causal=no``
  needs ``Q=0``. The causal and additive masks combine.

A row whose every element is ``-inf`` after masking has no softmax (numpy gives NaN); that
is outside the contract. Arguments: ``X[M,N]``, then ``scale[1]`` and ``mask[mask_rows,N]``
when used, then ``Y[M,N]``.

Schedule (:class:`SoftmaxSchedule`, the knobs of :mod:`tunecache.compiler.kinds.rowwise`):
``passes=3`` sweeps a row for its max, again for ``e = exp(z - max)`` (stored in Y) and its
sum, then scales Y by ``1/sum`` (one exp per element; Y is re-read from cache);
``passes=2`` keeps a running per-lane max and rescaled sum in one sweep (online softmax, an
extra exp per step), then writes ``exp(z - max) / sum`` (one read of X less and no re-read of
Y; a choice for long rows when memory, not the exps, is the limit). Causal rows only sweep
their unmasked prefix.
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

__all__ = ["SoftmaxSchedule", "softmax_op"]

SOFTMAX_PASSES = (2, 3)
# Initial running max: finite, so that exp(m_old - m_new) is never exp(-inf - -inf) = NaN.
_LOWEST = "(-__FLT_MAX__)"


@dataclass(frozen=True, slots=True)
class SoftmaxSchedule(RowSchedule):
    """Knobs of a softmax kernel (see the module docstring and ``rowwise.RowSchedule``)."""

    family: ClassVar[str] = "softmax"

    passes: int = 3


def softmax_op(M: int, N: int, *, scale: bool = False, mask_rows: int = 0, causal: bool = False,
               Q: int | None = None, dtype: str = "float32") -> OpSignature:
    """``softmax(X[M,N] * scale + mask)`` along ``N``; ``causal`` defaults to ``Q = N``."""
    q = (N if Q is None else Q) if causal else (0 if Q is None else Q)
    return OpSignature(
        KIND.name, (("M", M), ("N", N), ("mask_rows", mask_rows), ("Q", q)), dtype,
        (("scale", "yes" if scale else "no"), ("causal", "yes" if causal else "no")), (),
    )


def _signature_problems(op: OpSignature) -> list[str]:
    d = op.dims_dict
    found = []
    if d["mask_rows"] and d["M"] % d["mask_rows"]:
        found.append(f"mask_rows={d['mask_rows']} does not divide M={d['M']} (row i uses mask "
                     "row i // (M // mask_rows))")
    if op.attr("causal") == "yes":
        if not 1 <= d["Q"] <= d["N"]:
            found.append(f"causal=yes needs 1 <= Q <= N={d['N']} query rows per block, got "
                         f"Q={d['Q']}")
        elif d["M"] % d["Q"]:
            found.append(f"Q={d['Q']} does not divide M={d['M']} (row i is query i % Q)")
    elif d["Q"]:
        found.append(f"Q={d['Q']} applies to causal=yes only; use Q=0")
    return found


def _arguments(op: OpSignature) -> tuple[TensorArg, ...]:
    m, n = op.dim("M"), op.dim("N")
    args = [TensorArg("X", (m, n), "input")]
    if op.attr("scale") == "yes":
        args.append(TensorArg("scale", (1,), "input"))
    if op.dim("mask_rows"):
        args.append(TensorArg("mask", (op.dim("mask_rows"), n), "input"))
    args.append(TensorArg("Y", (m, n), "output"))
    return tuple(args)


def _flops(op: OpSignature) -> int:
    """Per element: max, subtract, exp, sum and normalise (an exp counts as one), plus the
    scale and the mask add when present."""
    per = 5 + (op.attr("scale") == "yes") + (op.dim("mask_rows") > 0)
    return per * op.dim("M") * op.dim("N")


def causal_keep(q: int, n: int) -> np.ndarray:
    """``[Q, N]`` booleans: which keys each query position of a causal block may see."""
    return np.arange(n)[None, :] <= np.arange(q)[:, None] + (n - q)


def _reference(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """The op in numpy, in the inputs' dtype (in place on one temporary: it is also the
    float32 fallback and the benchmark baseline)."""
    d = op.dims_dict
    m, n, mr, q = d["M"], d["N"], d["mask_rows"], d["Q"]
    rest = iter(inputs[1:])
    x = inputs[0]
    z = x * next(rest)[0] if op.attr("scale") == "yes" else x.copy()
    if mr:
        z.reshape(mr, m // mr, n)[...] += next(rest)[:, None, :]
    if op.attr("causal") == "yes":
        z.reshape(m // q, q, n)[:, ~causal_keep(q, n)] = -np.inf
    with np.errstate(invalid="ignore", divide="ignore"):  # a fully masked row is NaN
        z -= z.max(axis=1, keepdims=True)
        np.exp(z, out=z)
        z /= z.sum(axis=1, keepdims=True)
    return z


def _tolerance(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> tuple[float, float]:
    """Outputs lie in [0, 1]; each is wrong by the exp's 2 ulp plus the rounding of its
    argument, which grows with the magnitude of ``z``."""
    x = inputs[0]
    spread = float(np.abs(x).max()) if x.size else 0.0
    if op.attr("scale") == "yes":
        spread *= abs(float(inputs[1][0]))
    return 1e-5 + 4e-7 * spread, 1e-7


# -- code generation --------------------------------------------------------------------------


class _Rows:
    """C fragments for rows ``r0 + k`` of a block."""

    def __init__(self, op: OpSignature, lanes: int) -> None:
        self.op = op
        self.lanes = lanes
        self.scaled = op.attr("scale") == "yes"
        self.masked = op.dim("mask_rows") > 0
        self.causal = op.attr("causal") == "yes"

    def setup(self, k: int) -> list[str]:
        """Row pointers and the row's unmasked length ``L{k}``."""
        out = [f"const float *restrict x{k} = a->x + (r0 + {k}) * N;",
               f"float *restrict y{k} = a->y + (r0 + {k}) * N;"]
        if self.masked:
            out.append(f"const float *restrict m{k} = a->mask + ((r0 + {k}) / MASK_DIV) * N;")
        if self.causal:
            out.append(f"const long L{k} = (r0 + {k}) % QB + (N - QB) + 1;")
        return out

    def length(self, k: int) -> str:
        return f"L{k}" if self.causal else "N"

    def z(self, k: int, j: str) -> str:
        """``z`` for a whole vector of row ``k`` at column ``j``."""
        x = f"VLOADU(x{k} + {j})"
        if self.scaled and self.masked:
            return f"VFMA({x}, sc, VLOADU(m{k} + {j}))"
        if self.scaled:
            return f"VMUL({x}, sc)"
        if self.masked:
            return f"VADD({x}, VLOADU(m{k} + {j}))"
        return x

    def z_part(self, k: int, j: str, fill: str | None = None) -> str:
        """``z`` for the first ``n`` columns from ``j``; the other lanes ``fill`` (or
        ``0 * scale + 0``, finite, when ``fill`` is None)."""
        x = f"VLOADU_PART(x{k} + {j}, n)"
        if self.scaled:
            x = f"VMUL({x}, sc)"
        if self.masked:
            x = f"VADD({x}, VLOADU_PART(m{k} + {j}, n))"
        return x if fill is None else f"VFILL_PART({x}, n, {fill})"

    def zero_tail(self, k: int) -> list[str]:
        """Causal rows: the masked keys' outputs are 0."""
        if not self.causal:
            return []
        return [f"if (L{k} < N) memset(y{k} + L{k}, 0, sizeof(float) * (size_t)(N - L{k}));"]


def _block_three_pass(r: _Rows, k_rows: int, s: SoftmaxSchedule) -> list[str]:
    lanes, vec = r.lanes, s.vec
    lengths = [r.length(k) for k in range(k_rows)]
    out: list[str] = []
    for k in range(k_rows):
        out.append("vec " + ", ".join(f"{a} = VSET1({_LOWEST})"
                                      for a in vector_names("mx", k, vec)) + ";")

    def max_step(k: int, j: str, nv: int) -> list[str]:
        return [f"mx{k}_{v} = VMAX(mx{k}_{v}, {r.z(k, f'{j} + {v * lanes}')});" for v in range(nv)]

    def max_part(k: int, j: str) -> list[str]:
        return [f"mx{k}_0 = VMAX(mx{k}_0, {r.z_part(k, j, _LOWEST)});"]

    out += sweep(k_rows, vec, s.unroll, lanes, lengths, max_step, max_part)
    for k in range(k_rows):
        out.append(f"const vec mv{k} = VSET1(VHMAX({tree('VMAX', vector_names('mx', k, vec))}));")
        out.append("vec " + ", ".join(f"{a} = VZERO()" for a in vector_names("sm", k, vec)) + ";")

    def exp_step(k: int, j: str, nv: int) -> list[str]:
        lines = []
        for v in range(nv):
            col = f"{j} + {v * lanes}"
            lines.append(f"{{ const vec e = VEXP(VSUB({r.z(k, col)}, mv{k})); "
                         f"VSTOREU(y{k} + {col}, e); sm{k}_{v} = VADD(sm{k}_{v}, e); }}")
        return lines

    def exp_part(k: int, j: str) -> list[str]:
        return [f"const vec e = VFILL_PART(VEXP(VSUB({r.z_part(k, j)}, mv{k})), n, 0.0f);",
                f"VSTOREU_PART(y{k} + {j}, e, n); sm{k}_0 = VADD(sm{k}_0, e);"]

    out += sweep(k_rows, vec, s.unroll, lanes, lengths, exp_step, exp_part)
    for k in range(k_rows):
        out.append(f"const vec inv{k} = VSET1(1.0f / VHSUM({tree('VADD', vector_names('sm', k, vec))}));")

    def scale_step(k: int, j: str, nv: int) -> list[str]:
        return [f"VSTOREU(y{k} + {j} + {v * lanes}, VMUL(VLOADU(y{k} + {j} + {v * lanes}), inv{k}));"
                for v in range(nv)]

    def scale_part(k: int, j: str) -> list[str]:
        return [f"VSTOREU_PART(y{k} + {j}, VMUL(VLOADU_PART(y{k} + {j}, n), inv{k}), n);"]

    out += sweep(k_rows, vec, s.unroll, lanes, lengths, scale_step, scale_part)
    return out


def _block_two_pass(r: _Rows, k_rows: int, s: SoftmaxSchedule) -> list[str]:
    lanes, vec = r.lanes, s.vec
    lengths = [r.length(k) for k in range(k_rows)]
    out: list[str] = []
    for k in range(k_rows):
        out.append(f"vec rm{k} = VSET1({_LOWEST}), rs{k} = VZERO();")

    def online(k: int, zs: list[str]) -> list[str]:
        names = [f"z{v}" for v in range(len(zs))]
        lines = ["{", *(f"  const vec {name} = {z};" for name, z in zip(names, zs, strict=True)),
                 f"  const vec mn = VMAX(rm{k}, {tree('VMAX', names)});"]
        terms = [f"VEXP(VSUB({name}, mn))" for name in names]
        lines += [f"  rs{k} = VFMA(rs{k}, VEXP(VSUB(rm{k}, mn)), {tree('VADD', terms)});",
                  f"  rm{k} = mn;", "}"]
        return lines

    def stat_step(k: int, j: str, nv: int) -> list[str]:
        return online(k, [r.z(k, f"{j} + {v * lanes}") for v in range(nv)])

    def stat_part(k: int, j: str) -> list[str]:
        return online(k, [r.z_part(k, j, _LOWEST)])

    out += sweep(k_rows, vec, s.unroll, lanes, lengths, stat_step, stat_part)
    for k in range(k_rows):
        out += [f"const float mx{k} = VHMAX(rm{k});",
                f"const vec mv{k} = VSET1(mx{k});",
                f"const vec inv{k} = VSET1(1.0f / VHSUM(VMUL(rs{k}, VEXP(VSUB(rm{k}, mv{k})))));"]

    def out_step(k: int, j: str, nv: int) -> list[str]:
        return [f"VSTOREU(y{k} + {j} + {v * lanes}, "
                f"VMUL(VEXP(VSUB({r.z(k, f'{j} + {v * lanes}')}, mv{k})), inv{k}));"
                for v in range(nv)]

    def out_part(k: int, j: str) -> list[str]:
        return [f"VSTOREU_PART(y{k} + {j}, VMUL(VEXP(VSUB({r.z_part(k, j)}, mv{k})), "
                f"inv{k}), n);"]

    out += sweep(k_rows, vec, s.unroll, lanes, lengths, out_step, out_part)
    return out


def _block(r: _Rows, k_rows: int, s: SoftmaxSchedule) -> str:
    """``row_block{k_rows}``: softmax of rows ``r0 .. r0 + k_rows - 1``."""
    body: list[str] = []
    for k in range(k_rows):
        body += r.setup(k)
    if r.scaled:
        body.append("const vec sc = VSET1(a->scale);")
    body += (_block_three_pass if s.passes == 3 else _block_two_pass)(r, k_rows, s)
    for k in range(k_rows):
        body += r.zero_tail(k)
    return (f"static void row_block{k_rows}(const row_args *restrict a, long r0) {{\n"
            + "".join(f"  {line}\n" for line in body) + "}\n")


def generate_softmax(op: OpSignature, s: SoftmaxSchedule, d: IsaDialect) -> str:
    """The C translation unit for the softmax ``op`` under ``s`` (validated by the caller)."""
    dims = op.dims_dict
    r = _Rows(op, d.lanes)
    consts = {"M": dims["M"], "N": dims["N"]}
    if r.masked:
        consts["MASK_DIV"] = dims["M"] // dims["mask_rows"]
    if r.causal:
        consts["QB"] = dims["Q"]
    names = [a.name for a in op.arguments()]
    setup = (
        "  row_args a = {(const float *)args[0], "
        + (f"(const float *)args[{names.index('mask')}], " if r.masked else "NULL, ")
        + f"(float *)args[{len(names) - 1}], "
        + (f"((const float *)args[{names.index('scale')}])[0]" if r.scaled else "1.0f")
        + "};\n"
    )
    return translation_unit(d.prelude, consts,
                            "const float *x, *mask; float *y; float scale;",
                            lambda rows: _block(r, rows, s), s, setup)


def softmax_problems(op: OpSignature, s: SoftmaxSchedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``s`` is illegal for the softmax ``op`` on ``hw`` (empty when legal)."""
    return row_problems(op, s, hw, SOFTMAX_PASSES)


def default_softmax_schedule(op: OpSignature, hw: HardwareSpec,
                             threads: int = 1) -> SoftmaxSchedule:
    """The (vec, rows) of :func:`~tunecache.compiler.kinds.rowwise.default_shape`, 3 passes:
    the kernel is bound by its exps, and the online 2-pass one computes more of them (it
    was slower even on rows of 1 MiB, streamed from L3, on an AVX2 machine)."""
    vec, rows = default_shape(op, hw)
    return SoftmaxSchedule(vec=vec, rows=rows, passes=3, threads=threads)


KIND = register(OpKind(
    name="softmax",
    spec=KindSpec(
        dims=("M", "N"),
        attrs={"scale": ("no", "yes"), "causal": ("no", "yes")},
        epilogues=(),
        params={"mask_rows": (0, 0), "Q": (0, 0)},
        check=_signature_problems,
    ),
    arguments=_arguments,
    flops=_flops,
    schedule=SoftmaxSchedule,
    problems=softmax_problems,
    default_schedule=default_softmax_schedule,
    emit=generate_softmax,
    reference=_reference,
    reduction_length=lambda op: op.dim("N"),
    dim_columns={"M": "dim_m", "N": "dim_n", "mask_rows": "mask_rows", "Q": "dim_q"},
    baseline="numpy",
    tolerance=_tolerance,
    examples=("softmax(M=1536,N=128,mask_rows=1,scale=yes)",
              "softmax(M=768,N=64,Q=64,causal=yes)", "softmax(M=7,N=1000)"),
))
