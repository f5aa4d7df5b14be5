"""C code for Strassen's algorithm over the matmul micro-kernel (``strassen=1`` or ``2`` levels).

With A, B and C cut into 2x2 quadrants (halves rounded up; a half's row or column beyond the
matrix reads as zero and is never written), ``C = A·B`` takes seven products of half-size
blocks in place of eight (:data:`PRODUCTS`): 12.5% fewer FLOPs for a few additions of
half-size operands. Two levels cut A, B and C into a 4x4 grid of quarter-size blocks and run
the 49 products of :func:`products` (Strassen's table nested in itself) in place of 64; the
kernel below is the same for any level, only the table and the grid differ. B is a model's
constant weights, so ``tc_pack_weights`` forms the B sums once, in the micro-kernel's panels.
Per call the team forms the A sums (shared) row-major, in vectorised passes, and the
micro-kernel reads them in place (packing them into k-major panels, a strided store per
element, took 5-6% of the kernel: 3-7% slower on BERT's projections). Then each thread takes
its column micro-panels and, block by block (``mc`` x ``nc`` of a C block), runs the products'
micro-kernel tiles into a per-thread buffer holding that block of every C block of the grid
as contiguous ``MR x NR`` tiles: each tile is added with its sign into the blocks its
product reaches (the first contribution assigns). The finished block goes to C once,
clipped, with the epilogue. The buffer matters: adding tiles straight into C rows
``N`` floats apart ran 3-5% slower on BERT's FFN (cache-set conflicts, 4K aliasing).

Entries and ABI as ``emit.py`` (``tc_kernel``, ``tc_time`` and the pre-packed-B entries);
``tc_kernel`` forms the B sums on every call and exists for checking, not speed.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunecache.compiler.codegen.abi import (
    ALIGN_FLOATS,
    PackedWeights,
    kernel_entries,
    preamble,
    round_up,
)
from tunecache.compiler.codegen.epilogue import render, scalar_helpers
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.kinds.matmul.emit import plain_micro_kernel
from tunecache.compiler.kinds.matmul.space import MatmulSchedule, strassen_blocks
from tunecache.compiler.ops import OpSignature

Term = tuple[int, int, int]
"""(block row, block column, sign) of one operand block in a sum."""


@dataclass(frozen=True, slots=True)
class Product:
    """One of Strassen's products: ``(sum of a) @ (sum of b)``, added with its sign to each
    block of ``c``."""

    a: tuple[Term, ...]
    b: tuple[Term, ...]
    c: tuple[Term, ...]


PRODUCTS = (
    Product(a=((0, 0, 1), (1, 1, 1)), b=((0, 0, 1), (1, 1, 1)), c=((0, 0, 1), (1, 1, 1))),
    Product(a=((1, 0, 1), (1, 1, 1)), b=((0, 0, 1),), c=((1, 0, 1), (1, 1, -1))),
    Product(a=((0, 0, 1),), b=((0, 1, 1), (1, 1, -1)), c=((0, 1, 1), (1, 1, 1))),
    Product(a=((1, 1, 1),), b=((1, 0, 1), (0, 0, -1)), c=((0, 0, 1), (1, 0, 1))),
    Product(a=((0, 0, 1), (0, 1, 1)), b=((1, 1, 1),), c=((0, 0, -1), (0, 1, 1))),
    Product(a=((1, 0, 1), (0, 0, -1)), b=((0, 0, 1), (0, 1, 1)), c=((1, 1, 1),)),
    Product(a=((0, 1, 1), (1, 1, -1)), b=((1, 0, 1), (1, 1, 1)), c=((0, 0, 1),)),
)
"""Strassen's products: P1 = (A11+A22)(B11+B22) into C11 and C22, P2 = (A21+A22)B11 into C21
and -C22, P3 = A11(B12-B22) into C12 and C22, P4 = A22(B21-B11) into C11 and C21,
P5 = (A11+A12)B22 into -C11 and C12, P6 = (A21-A11)(B11+B12) into C22, P7 = (A12-A22)(B21+B22)
into C11. Every quadrant's first contribution is positive."""


def _nest(outer: tuple[Term, ...], inner: tuple[Term, ...]) -> tuple[Term, ...]:
    """Terms of a block of a block: row and column ``2 * outer + inner``, signs multiplied."""
    return tuple((2 * oi + ii, 2 * oj + ij, os * isign)
                 for oi, oj, os in outer for ii, ij, isign in inner)


def products(levels: int) -> tuple[Product, ...]:
    """Strassen applied ``levels`` times: ``7 ** levels`` products of blocks of a
    ``2 ** levels`` square grid (each product of the outer level run by the inner one)."""
    out: tuple[Product, ...] = PRODUCTS
    for _ in range(levels - 1):
        out = tuple(Product(_nest(o.a, i.a), _nest(o.b, i.b), _nest(o.c, i.c))
                    for o in out for i in PRODUCTS)
    return out


Block = tuple[int, int]


def _first_contributors(table: tuple[Product, ...]) -> dict[Block, int]:
    """Each C block's first product in ``table`` (that product assigns, later ones add)."""
    first: dict[Block, int] = {}
    for n, product in enumerate(table):
        for qi, qj, _ in product.c:
            first.setdefault((qi, qj), n)
    return first


def _op(sign: int) -> str:
    return "+" if sign > 0 else "-"


def _form_a(n: int, product: Product) -> str:
    """Rows ``i0..i1`` of product ``n``'s A sum, row-major ``KHP`` floats apart (read in
    place by the micro-kernel); rows and columns beyond A read as zero."""
    inside = " && ".join(f"{qi} * MH + i < M && {qk} * KH + KH <= K" for qi, qk, _ in product.a)
    ptrs = " ".join(f"const float *restrict x{t} = A + ({qi} * MH + i) * ARS + {qk} * KH * APS;"
                    for t, (qi, qk, _) in enumerate(product.a))
    fast = " ".join(f"{_op(sign)} x{t}[p * APS]" for t, (_, _, sign) in enumerate(product.a))
    slow = " ".join(
        f"if ({qi} * MH + i < M && {qk} * KH + p < K) "
        f"v {_op(sign)}= A[({qi} * MH + i) * ARS + ({qk} * KH + p) * APS];"
        for qi, qk, sign in product.a)
    return f"""\
static void form_a{n}(float *restrict dst, const float *restrict A, long i0, long i1) {{
  for (long i = i0; i < i1; i++) {{
    float *restrict o = dst + i * KHP;
    if (i < MH && {inside}) {{
      {ptrs}
      for (long p = 0; p < KH; p++) o[p] = 0.0f {fast};
    }} else {{
      for (long p = 0; p < KH; p++) {{
        float v = 0.0f;
        if (i < MH) {{ {slow} }}
        o[p] = v;
      }}
    }}
  }}
}}
"""


def _pack_b(n: int, product: Product) -> str:
    """Product ``n``'s B sum in NR-column panels, block by block of KC rows (compile time)."""
    terms = " ".join(f"v {_op(sign)}= b_at(B, {qk} * KH + k, {qj} * NH + j);"
                     for qk, qj, sign in product.b)
    return f"""\
static void pack_b{n}(float *restrict dst, const float *restrict B) {{
  for (long pc = 0; pc < KH; pc += KC) {{
    const long k_cur = MIN(KC, KH - pc);
    for (long jp = 0; jp < NPAN; jp++)
      for (long kk = 0; kk < k_cur; kk++)
        for (long q = 0; q < NR; q++) {{
          const long k = pc + kk, j = jp * NR + q;
          float v = 0.0f;
          if (j < NH) {{ {terms} }}
          dst[pc * NPAN * NR + jp * k_cur * NR + kk * NR + q] = v;
        }}
  }}
}}
"""


def _scatter(n: int, product: Product, first_of: dict[Block, int], grid: int) -> str:
    """Add product ``n``'s finished tile ``ct`` into its C blocks' tiles of the C block
    buffer (contiguous MR x NR tiles, block ``grid * row + column``): assigning on a
    block's first contribution."""
    lines = []
    for qi, qj, sign in product.c:
        first = first_of[(qi, qj)] == n
        q = grid * qi + qj
        old = f"VLOAD(t{q} + e)"
        if sign > 0:
            step = f"VADD({old}, x)" if not first else f"kf ? x : VADD({old}, x)"
        else:
            step = f"VSUB({old}, x)" if not first else f"kf ? VNEG(x) : VSUB({old}, x)"
        lines.append(f"  {{ float *restrict t{q} = cb + {q} * QUAD + tile;\n"
                     f"    for (long e = 0; e < MR * NR; e += LANES) {{ const vec x = "
                     f"VLOAD(ct + e); VSTORE(t{q} + e, {step}); }} }}")
    body = "\n".join(lines)
    return f"""\
static inline void scatter{n}(const float *restrict ct, float *restrict cb, long tile, int kf) {{
  (void)kf;
{body}
}}
"""


def _write_out(op: OpSignature, vectors: int, lanes: int) -> str:
    """The C block buffer's blocks into C, clipped to the matrix, with the epilogue."""
    has_bias = "bias" in op.epilogue
    vec_ep = render(op.epilogue, "x", {"bias": "VLOADU(bj + {o})"}, vector=True)
    vec = " ".join(
        f"{{ vec x = VLOAD(t + r * NR + {v * lanes}); "
        + vec_ep.replace("{o}", str(v * lanes))
        + f" VSTOREU(c + r * N + {v * lanes}, x); }}" for v in range(vectors))
    scalar_ep = render(op.epilogue, "x", {"bias": "bj[q]"}, vector=False)
    return f"""\
static void write_out(const float *restrict cb, float *restrict C, const float *restrict bias,
                      long ic, long ie, long jc, long je) {{
  (void)bias;
  for (long h = 0; h < G * G; h++) {{
    const long qi = h / G, qj = h % G;
    const long rows_q = MIN(MH, M - qi * MH), cols_q = MIN(NH, N - qj * NH);
    if (rows_q <= 0 || cols_q <= 0) continue;
    for (long jp = jc; jp < je; jp++)
      for (long ip = ic; ip < ie; ip++) {{
        const float *t = cb + h * QUAD + ((jp - jc) * (ie - ic) + (ip - ic)) * MR * NR;
        const long i = ip * MR, j = jp * NR;
        const long rows = MIN(MR, rows_q - i), cols = MIN(NR, cols_q - j);
        float *c = C + (qi * MH + i) * N + qj * NH + j;
        const float *bj = {"bias + qj * NH + j" if has_bias else "bias"};
        (void)bj;
        if (rows == MR && cols == NR) {{
          for (long r = 0; r < MR; r++) {{ {vec} }}
        }} else {{
          for (long r = 0; r < rows; r++)
            for (long q = 0; q < cols; q++) {{
              float x = t[r * NR + q]; {scalar_ep}
              c[r * N + q] = x;
            }}
        }}
      }}
  }}
}}
"""


BODY = """\
static void form_a_sum(int n, float *dst, const float *A, long i0, long i1) {
  switch (n) {
%(pack_cases)s
  }
}

static void pack_weights(const float *B, float *packed) {
%(pack_b_calls)s
}

static void strassen_body(const float *restrict A, const float *restrict Bp,
                          const float *restrict bias, float *restrict C, float *restrict Ap,
                          float *restrict priv, int tid, int nth) {
  (void)tid; (void)nth;
  float *ct = priv, *cb = priv + CT_REGION;
  { /* the A sums, MR rows at a time, shared by the team */
    long lo, hi;
    split_range(NPROD * MPAN, tid, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
      const long n = t / MPAN, ip = t %% MPAN;
      form_a_sum((int)n, Ap + n * AS_STRIDE, A, ip * MR, ip * MR + MR);
    }
  }
  BARRIER();
  long lo, hi;
  split_range(NPAN, tid, nth, &lo, &hi);
  for (long ic = 0; ic < MPAN; ic += MCP) {
    const long ie = MIN(MPAN, ic + MCP);
    for (long jc = lo; jc < hi; jc += NCP) {
      const long je = MIN(hi, jc + NCP);
      for (long pc = 0; pc < KH; pc += KC) {
        const long k_cur = MIN(KC, KH - pc);
        const int kf = pc == 0;
%(products)s
      }
      write_out(cb, C, bias, ic, ie, jc, je);
    }
  }
}
"""

PRODUCT_LOOP = """\
        { /* product %(n)d */
          const float *ab = Ap + %(n)dL * AS_STRIDE + pc;
          const float *bb = Bp + %(n)dL * BP_STRIDE + pc * NPAN * NR;
          for (long jp = jc; jp < je; jp++)
            for (long ip = ic; ip < ie; ip++) {
              const long tile = ((jp - jc) * (ie - ic) + (ip - ic)) * MR * NR;
              %(tile)s
            }
        }"""


def _product_loop(n: int, product: Product, first_of: dict[Block, int], grid: int) -> str:
    """Product ``n`` over the C block: its tiles go through ``ct`` into their blocks, or,
    when it only adds to one block, straight into that block's tile."""
    (qi, qj, sign), *more = product.c
    a, b = "ab + ip * MR * KHP", "bb + jp * k_cur * NR"
    if not more and sign > 0 and first_of[(qi, qj)] != n:
        tile = f"ukr_sp(k_cur, {a}, {b}, cb + {grid * qi + qj} * QUAD + tile, NR, 0, 0, NULL);"
    else:
        tile = (f"ukr_sp(k_cur, {a}, {b}, ct, NR, 1, 0, NULL);\n"
                f"              scatter{n}(ct, cb, tile, kf);")
    return PRODUCT_LOOP % {"n": n, "tile": tile}


def generate_strassen(op: OpSignature, s: MatmulSchedule, d: IsaDialect) -> str:
    """The C translation unit for ``op`` under a ``strassen=1`` or ``2`` schedule (validated)."""
    M, N, K = op.dim("M"), op.dim("N"), op.dim("K")
    levels = s.strassen
    table, grid = products(levels), 2 ** levels
    first_of = _first_contributors(table)
    mh, nh, kh = strassen_blocks(op, levels)
    mr, nr = s.mr, s.nr
    kc = min(s.kc, kh)
    mpan, npan = -(-mh // mr), -(-nh // nr)
    # Rows of an A sum one cache line longer than a multiple of 16 floats: the MR rows a
    # micro-kernel reads together then fall in different L1 sets (K = 3072 put them in two).
    khp = round_up(kh, ALIGN_FLOATS) + ALIGN_FLOATS
    a_stride, b_stride = mpan * mr * khp, kh * npan * nr
    mcp = max(1, min(s.mc, mpan * mr) // mr)
    ncp = max(1, min(s.nc, npan * nr) // nr)
    quad = mcp * ncp * mr * nr
    a_region = round_up(len(table) * a_stride, ALIGN_FLOATS)
    ct_region = round_up(mr * nr, ALIGN_FLOATS)
    priv_region = round_up(ct_region + grid * grid * quad, ALIGN_FLOATS)
    constants: dict[str, int | str] = {
        "M": M, "N": N, "K": K, "MH": mh, "NH": nh, "KH": kh, "MR": mr, "NR": nr, "KC": kc,
        "MPAN": mpan, "NPAN": npan,
        "MCP": mcp, "NCP": ncp, "QUAD": quad, "LANES": d.lanes,
        "ARS": 1 if op.trans_a else K, "APS": M if op.trans_a else 1,
        "BPS": 1 if op.trans_b else N, "BCS": K if op.trans_b else 1,
        "KHP": khp, "AS_STRIDE": a_stride, "BP_STRIDE": b_stride,
        "B_PACKED_FLOATS": len(table) * b_stride, "G": grid, "NPROD": len(table),
        "A_REGION": a_region, "CT_REGION": ct_region, "PRIV_REGION": priv_region,
    }
    out = [preamble(d, constants, s.threads)]
    out += filter(None, [scalar_helpers(op.epilogue)])
    out.append("static inline float b_at(const float *B, long k, long j) {\n"
               "  return (k < K && j < N) ? B[k * BPS + j * BCS] : 0.0f;\n}\n")
    # The A sums are row-major, rows KHP floats apart.
    out.append(plain_micro_kernel("ukr_sp", s, d, "1", "KHP"))
    for n, product in enumerate(table):
        out += [_form_a(n, product), _pack_b(n, product), _scatter(n, product, first_of, grid)]
    out.append(_write_out(op, s.nr // d.lanes, d.lanes))
    out.append(BODY % {
        "pack_cases": "\n".join(f"    case {n}: form_a{n}(dst, A, i0, i1); break;"
                                for n in range(len(table))),
        "products": "\n".join(_product_loop(n, p, first_of, grid) for n, p in enumerate(table)),
        "pack_b_calls": "\n".join(f"  pack_b{n}(packed + {n}L * BP_STRIDE, B);"
                                  for n in range(len(table))),
    })
    priv = "ws + A_REGION + TID * PRIV_REGION"

    def body(packed: bool) -> str:
        if packed:
            return f"strassen_body(A, B, bias, C, ws, {priv}, TID, NTH);"
        bp = f"ws + A_REGION + {s.threads}L * PRIV_REGION"
        return (f"if (TID == 0) pack_weights(B, {bp});\n    BARRIER();\n"
                f"    strassen_body(A, {bp}, bias, C, ws, {priv}, TID, NTH);")

    return "\n".join(out) + "\n" + kernel_entries(
        op, body, threads=s.threads,
        ws_floats=f"A_REGION + {s.threads}L * PRIV_REGION + B_PACKED_FLOATS",
        packed_ws_floats=f"A_REGION + {s.threads}L * PRIV_REGION", optional=("bias",),
        packed=PackedWeights("B_PACKED_FLOATS", "pack_weights(weights, packed);"))
