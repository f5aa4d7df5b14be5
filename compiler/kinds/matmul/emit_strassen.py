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
product reaches (the first contribution assigns). Each row tile prefetches its share of the
next B panel spread over its k steps, as ``emit.py``'s kernels do. The finished block goes
to C once, clipped, with the epilogue. The buffer matters: adding tiles straight into C rows
``N`` floats apart ran 3-5% slower on BERT's FFN (cache-set conflicts, 4K aliasing).

The products are data, not code: tables of each product's A and B sums (``A_SUMS``,
``B_SUMS``) and C blocks (``TARGETS``) drive one loop, so the micro-kernel is inlined twice
whatever the level. A function per product (49 at two levels, each inlining its loop) made
225 KB of machine code and took gcc 8-60 s per kernel, against 1-2 s for the tables, at the
same speed within this VM's noise (ARCHITECTURE change 59).

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
)
from tunecache.compiler.codegen.epilogue import render, scalar_helpers
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.kinds.matmul import emit
from tunecache.compiler.kinds.matmul.emit import plain_micro_kernel
from tunecache.compiler.kinds.matmul.space import MatmulSchedule, strassen_blocks
from tunecache.compiler.mathutil import round_up
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


def _c_array(values: list[int], width: int) -> str:
    """``values`` as a C array initialiser of ``width`` entries, zero-padded."""
    return "{" + ", ".join(map(str, values + [0] * (width - len(values)))) + "}"


def _sums(name: str, sums: list[tuple[Term, ...]], width: int) -> str:
    """Each product's operand sum as C data (``sum_t``): its blocks' rows, columns, signs."""
    rows = [f"  {{{len(t)}, {_c_array([r for r, _, _ in t], width)}, "
            f"{_c_array([c for _, c, _ in t], width)}, {_c_array([g for _, _, g in t], width)}}},"
            for t in sums]
    return f"static const sum_t {name}[NPROD] = {{\n" + "\n".join(rows) + "\n};\n"


def _form_a(width: int) -> str:
    """Rows ``i0..i1`` of product ``n``'s A sum, row-major ``KHP`` floats apart (read in
    place by the micro-kernel); rows and columns beyond A read as zero. One loop per number
    of terms, so each is one vectorised pass."""
    cases = []
    for n in range(1, width + 1):
        terms = " + ".join(f"g[{t}] * x[{t}][p * APS]" for t in range(n))
        cases.append(f"      case {n}: for (long p = 0; p < KH; p++) o[p] = {terms}; break;")
    body = "\n".join(cases)
    return f"""\
static void form_a_sum(int n, float *restrict dst, const float *restrict A, long i0, long i1) {{
  const sum_t *s = &A_SUMS[n];
  float g[SUM_TERMS];
  int whole = 1;
  for (int t = 0; t < s->n; t++) {{
    g[t] = (float)s->sign[t];
    whole = whole && s->c[t] * KH + KH <= K;
  }}
  for (long i = i0; i < i1; i++) {{
    float *restrict o = dst + i * KHP;
    int inside = whole && i < MH;
    for (int t = 0; t < s->n; t++) inside = inside && s->r[t] * MH + i < M;
    if (inside) {{
      const float *restrict x[SUM_TERMS];
      for (int t = 0; t < s->n; t++) x[t] = A + (s->r[t] * MH + i) * ARS + s->c[t] * KH * APS;
      switch (s->n) {{
{body}
      }}
    }} else {{
      for (long p = 0; p < KH; p++) {{
        float v = 0.0f;
        for (int t = 0; t < s->n && i < MH; t++)
          if (s->r[t] * MH + i < M && s->c[t] * KH + p < K)
            v += g[t] * A[(s->r[t] * MH + i) * ARS + (s->c[t] * KH + p) * APS];
        o[p] = v;
      }}
    }}
  }}
}}
"""


PACK_B = """\
static void pack_b_sum(const sum_t *s, float *restrict dst, const float *restrict B) {
  for (long pc = 0; pc < KH; pc += KC) {
    const long k_cur = MIN(KC, KH - pc);
    for (long jp = 0; jp < NPAN; jp++)
      for (long kk = 0; kk < k_cur; kk++)
        for (long q = 0; q < NR; q++) {
          const long k = pc + kk, j = jp * NR + q;
          float v = 0.0f;
          for (int t = 0; t < s->n && j < NH; t++)
            v += (float)s->sign[t] * b_at(B, s->r[t] * KH + k, s->c[t] * NH + j);
          dst[pc * NPAN * NR + jp * k_cur * NR + kk * NR + q] = v;
        }
  }
}

static void pack_weights(const float *B, float *packed) {
  for (int n = 0; n < NPROD; n++) pack_b_sum(&B_SUMS[n], packed + n * BP_STRIDE, B);
}
"""
"""Each product's B sum in NR-column panels, block by block of KC rows (compile time)."""


def _targets(table: tuple[Product, ...], grid: int) -> str:
    """Each product's C blocks as C data (``TARGETS``): block ``grid * row + column``, sign,
    whether it is the block's first contribution (that one assigns on the first K block),
    and ``direct``, the block a product that only adds to one block runs its tiles into."""
    first_of = _first_contributors(table)
    width = max(len(p.c) for p in table)
    rows = []
    for n, product in enumerate(table):
        (qi, qj, sign), *more = product.c
        direct = grid * qi + qj if not more and sign > 0 and first_of[(qi, qj)] != n else -1
        fields = [[grid * i + j for i, j, _ in product.c], [sg for _, _, sg in product.c],
                  [int(first_of[(i, j)] == n) for i, j, _ in product.c]]
        cells = ", ".join(_c_array(f, width) for f in fields)
        rows.append(f"  {{{len(product.c)}, {direct}, {cells}}},")
    return (f"typedef struct {{ signed char n, direct, q[{width}], sign[{width}], "
            f"first[{width}]; }} target_t;\n"
            "static const target_t TARGETS[NPROD] = {\n" + "\n".join(rows) + "\n};\n")


SCATTER = """\
static inline void scatter(const float *restrict ct, float *restrict cb, long tile, int kf,
                           const target_t *t) {
  for (int h = 0; h < t->n; h++) {
    float *restrict d = cb + t->q[h] * QUAD + tile;
    const int assign = kf && t->first[h];
    if (t->sign[h] > 0 && assign)
      for (long e = 0; e < MR * NR; e += LANES) VSTORE(d + e, VLOAD(ct + e));
    else if (t->sign[h] > 0)
      for (long e = 0; e < MR * NR; e += LANES) VSTORE(d + e, VADD(VLOAD(d + e), VLOAD(ct + e)));
    else if (assign)
      for (long e = 0; e < MR * NR; e += LANES) VSTORE(d + e, VNEG(VLOAD(ct + e)));
    else
      for (long e = 0; e < MR * NR; e += LANES) VSTORE(d + e, VSUB(VLOAD(d + e), VLOAD(ct + e)));
  }
}
"""
"""A product's finished tile ``ct`` added with its sign into its C blocks' tiles of the C
block buffer (contiguous MR x NR tiles): assigned on a block's first contribution."""


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
static void strassen_body(const float *restrict A, const float *restrict Bp,
                          const float *restrict bias, float *restrict C, float *restrict Ap,
                          float *restrict priv, int tid, int nth) {
  (void)tid; (void)nth;
  float *ct = priv, *cb = priv + CT_REGION;
  { /* the A sums, MR rows at a time, shared by the team */
    long lo, hi;
    split_range(NPROD * MPAN, tid, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
      const long n = t / MPAN, ip = t % MPAN;
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
        for (int n = 0; n < NPROD; n++) {
          const float *ab = Ap + n * AS_STRIDE + pc;
          const float *bb = Bp + n * BP_STRIDE + pc * NPAN * NR;
          const target_t *t = &TARGETS[n];
          for (long jp = jc; jp < je; jp++) {
/*NEXT*/            for (long ip = ic; ip < ie; ip++) {
              const long tile = ((jp - jc) * (ie - ic) + (ip - ic)) * MR * NR;
              const float *a = ab + ip * MR * KHP, *b = bb + jp * k_cur * NR;
/*PLAN*/              if (t->direct >= 0) {
                ukr_sp(k_cur, a, b, cb + t->direct * QUAD + tile, NR, 0, 0, NULL/*PF*/);
              } else {
                ukr_sp(k_cur, a, b, ct, NR, 1, 0, NULL/*PF*/);
                scatter(ct, cb, tile, kf, t);
              }
            }
          }
        }
      }
      write_out(cb, C, bias, ic, ie, jc, je);
    }
  }
}
"""

# The panel after (n, jp): the product's next one in this column block, else the next
# product's first one there (same K block); its share spread over the row tiles as in
# emit.py (ARCHITECTURE change 86).
NEXT_PANEL = """\
            const float *next = jp + 1 < je ? bb + (jp + 1) * k_cur * NR
                : n + 1 < NPROD ? Bp + (n + 1) * BP_STRIDE + pc * NPAN * NR + jc * k_cur * NR
                : NULL;
            const long lines = NR * k_cur / 16;
"""
TILE_PLAN = emit.tile_plan("ip - ic", "ie - ic", " " * 14)


def _body(spread: bool) -> str:
    """:data:`BODY`, its micro-kernel calls spreading the next B panel's prefetch or not."""
    return (BODY.replace("/*NEXT*/", NEXT_PANEL if spread else "")
            .replace("/*PLAN*/", TILE_PLAN if spread else "")
            .replace("/*PF*/", emit.PF_ARGS if spread else ""))


def generate_strassen(op: OpSignature, s: MatmulSchedule, d: IsaDialect) -> str:
    """The C translation unit for ``op`` under a ``strassen=1`` or ``2`` schedule (validated)."""
    M, N, K = op.dim("M"), op.dim("N"), op.dim("K")
    levels = s.strassen
    table, grid = products(levels), 2 ** levels
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
        "SUM_TERMS": max(len(terms) for p in table for terms in (p.a, p.b)),
        "A_REGION": a_region, "CT_REGION": ct_region, "PRIV_REGION": priv_region,
    }
    out = [preamble(d, constants, s.threads)]
    out += filter(None, [scalar_helpers(op.epilogue)])
    out.append("static inline float b_at(const float *B, long k, long j) {\n"
               "  return (k < K && j < N) ? B[k * BPS + j * BCS] : 0.0f;\n}\n")
    # The A sums are row-major, rows KHP floats apart.
    spread = emit.spreads_prefetch(mh, mr)
    if spread:
        out.append(emit.PREFETCH_PLAN)
    out.append(plain_micro_kernel("ukr_sp", s, d, "1", "KHP", spread))
    width = int(constants["SUM_TERMS"])
    out += ["typedef struct { signed char n, r[SUM_TERMS], c[SUM_TERMS], sign[SUM_TERMS]; "
            "} sum_t;\n",
            _sums("A_SUMS", [p.a for p in table], width),
            _sums("B_SUMS", [p.b for p in table], width),
            _targets(table, grid), _form_a(width), PACK_B, SCATTER]
    out.append(_write_out(op, s.nr // d.lanes, d.lanes))
    out.append(_body(spread))
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
