"""C code for matmuls whose B is stored transposed, as dot products along K.

``loop_order="dot"`` (``C = A · Bᵀ`` with ``A[M,K]`` and ``B[N,K]``, both K-contiguous): each
register tile holds ``mr`` rows of A times ``nr/lanes`` rows of B as vector accumulators
along K, reduced horizontally at the end. Nothing is packed, so B is read exactly once per
row block of A — what matrix-vector products (batch-1 classifiers, decode steps) need, where
the BLIS path would transpose all of B into panels on every call. Row blocks of ``nc`` rows
of B are kept hot in cache while every tile of A passes over them.
"""

from __future__ import annotations

from tunecache.compiler.codegen.abi import kernel_entries, preamble
from tunecache.compiler.codegen.epilogue import render, scalar_helpers
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.ops import OpSignature

# The dialect's horizontal sum, under the name the dot kernels have always called it.
_HSUM = "static inline float hsum(vec v) { return VHSUM(v); }"


def _tile(mr: int, nv: int, lanes: int, unroll: int, epilogue: tuple[str, ...]) -> str:
    """``mr`` rows of A against ``nv`` rows of B, all along K.

    Not the outer-product micro-kernel of ``codegen/microkernel.py``: both operands are
    vectors along K (no broadcast), and every accumulator is reduced horizontally before a
    scalar tail and the epilogue.
    """
    lines = [
        "static inline void dot_tile(const float *restrict a, const float *restrict b, "
        "const float *restrict bias, float *restrict c) {",
    ]
    for r in range(mr):
        lines.append("  vec " + ", ".join(f"c{r}_{q} = VZERO()" for q in range(nv)) + ";")
    lines.append("  long k = 0;")
    if unroll > 1:
        lines.append(f"#pragma GCC unroll {unroll}")
    lines.append(f"  for (; k + {lanes} <= K; k += {lanes}) {{")
    lines.append("    vec " + ", ".join(f"b{q} = VLOADU(b + {q} * K + k)" for q in range(nv)) + ";")
    for r in range(mr):
        fmas = " ".join(f"c{r}_{q} = VFMA(a{r}, b{q}, c{r}_{q});" for q in range(nv))
        lines.append(f"    {{ vec a{r} = VLOADU(a + {r} * K + k); {fmas} }}")
    lines.append("  }")
    for r in range(mr):
        lines.append("  float " + ", ".join(f"s{r}_{q} = hsum(c{r}_{q})" for q in range(nv)) + ";")
    lines.append("  for (; k < K; k++) {")
    for r in range(mr):
        lines.append("    " + " ".join(f"s{r}_{q} += a[{r} * K + k] * b[{q} * K + k];"
                                       for q in range(nv)))
    lines.append("  }")
    for r in range(mr):
        for q in range(nv):
            v = f"s{r}_{q}"
            epi = render(epilogue, v, {"bias": f"bias[{q}]"}, vector=False)
            lines.append(f"  {epi + ' ' if epi else ''}c[{r} * N + {q}] = {v};")
    lines.append("}")
    return "\n".join(lines)


def generate_matmul_dot(op: OpSignature, s: MatmulSchedule, d: IsaDialect) -> str:
    """The C translation unit for ``op`` (layout ``nt``) under a ``dot`` schedule."""
    dims = op.dims_dict
    M, N, K = dims["M"], dims["N"], dims["K"]
    nv = s.nr // d.lanes
    nc = max(nv, min(s.nc, N) // nv * nv)
    has_bias = "bias" in op.epilogue
    a_batch = 0 if op.shared == "a" else M * K
    b_batch = 0 if op.shared == "b" else K * N
    epi_edge = render(op.epilogue, "v", {"bias": "bias[j + q]"}, vector=False)
    threaded = s.threads > 1 and s.parallel != "batch"
    constants = {"M": M, "N": N, "K": K, "BATCH": op.batch, "MR": s.mr, "NV": nv, "NCB": nc,
                 "A_BATCH": a_batch, "B_BATCH": b_batch, "C_BATCH": M * N}
    out = [preamble(d, constants, 1), *filter(None, [scalar_helpers(op.epilogue)]), _HSUM,
           _tile(s.mr, nv, d.lanes, s.unroll, op.epilogue),
           f"""\
static void dot_edge(const float *restrict a, const float *restrict b,
                     const float *restrict bias, float *restrict c, long mh, long nh, long j) {{
  (void)bias; (void)j;
  for (long r = 0; r < mh; r++)
    for (long q = 0; q < nh; q++) {{
      vec acc = VZERO();
      long k = 0;
      for (; k + {d.lanes} <= K; k += {d.lanes})
        acc = VFMA(VLOADU(a + r * K + k), VLOADU(b + q * K + k), acc);
      float v = hsum(acc);
      for (; k < K; k++) v += a[r * K + k] * b[q * K + k];
      {epi_edge}
      c[r * N + q] = v;
    }}
}}

/* Rows [i_lo, i_hi) of A against rows [j_lo, j_hi) of B, B in blocks of NCB rows. */
static void dot_range(const float *restrict A, const float *restrict B,
                      const float *restrict bias, float *restrict C,
                      long i_lo, long i_hi, long j_lo, long j_hi) {{
  for (long jc = j_lo; jc < j_hi; jc += NCB) {{
    const long j_end = jc + NCB < j_hi ? jc + NCB : j_hi;
    for (long i = i_lo; i < i_hi; i += MR) {{
      const long mh = i + MR <= i_hi ? MR : i_hi - i;
      for (long j = jc; j < j_end; j += NV) {{
        const long nh = j + NV <= j_end ? NV : j_end - j;
        const float *bj = {"bias + j" if has_bias else "bias"};
        if (mh == MR && nh == NV) dot_tile(A + i * K, B + j * K, bj, C + i * N + j);
        else dot_edge(A + i * K, B + j * K, bias, C + i * N + j, mh, nh, j);
      }}
    }}
  }}
}}

static void split(long n, long unit, int tid, int nth, long *lo, long *hi) {{
  long units = (n + unit - 1) / unit, base = units / nth, extra = units % nth;
  long first = tid * base + (tid < extra ? tid : extra);
  long count = base + (tid < extra ? 1 : 0);
  *lo = first * unit < n ? first * unit : n;
  *hi = (first + count) * unit < n ? (first + count) * unit : n;
}}
""",
           ]
    call = "dot_range(A + b * A_BATCH, B + b * B_BATCH, bias, C + b * C_BATCH, "
    if s.threads == 1:
        body = f"for (long b = 0; b < BATCH; b++) {call}0, M, 0, N);"
    elif not threaded:
        # Batch items split as OpenMP's schedule(static) would.
        body = ("{ long lo, hi; split_range(BATCH, TID, NTH, &lo, &hi);\n"
                f"      for (long b = lo; b < hi; b++) {call}0, M, 0, N); }}")
    elif s.parallel == "n":
        body = (f"for (long b = 0; b < BATCH; b++) {{ long lo, hi; split(N, NV, TID, NTH, &lo, &hi);"
                f" {call}0, M, lo, hi); }}")
    else:
        body = (f"for (long b = 0; b < BATCH; b++) {{ long lo, hi; split(M, MR, TID, NTH, &lo, &hi);"
                f" {call}lo, hi, 0, N); }}")
    out.append(kernel_entries(op, lambda packed: body, threads=s.threads, ws_floats=None,
                              optional=("bias",)))
    return "\n".join(out)
