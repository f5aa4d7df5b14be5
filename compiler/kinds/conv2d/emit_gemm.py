"""C code of the implicit-GEMM conv2d kernel (``algorithm="gemm"``).

Per group, ``Y[F,P*Q] = W[F,C*R*S] @ im2col(X)``: the weights packed into ``oc_block``-row
panels (the A operand, broadcast), each thread's im2col panels packed on the fly (the B
operand, vectors along output pixels) or, for small 1x1 panels, read in place from X's rows;
the micro-kernel writes NCHW output rows directly, partial tiles go through a local tile
merged by scalar code. :func:`generate_gemm` renders a :class:`_GemmPlan`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tunecache.compiler.codegen.abi import ALIGN_FLOATS, preamble
from tunecache.compiler.codegen.epilogue import scalar_helpers
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.codegen.microkernel import Loop, Store, Tile, micro_kernel
from tunecache.compiler.kinds.conv2d.common import conv2d_entries, shape_constants
from tunecache.compiler.kinds.conv2d.epilogue import epilogue_scalar
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule
from tunecache.compiler.mathutil import ceil_div, round_up
from tunecache.compiler.ops import OpSignature


def _gemm_ukr(name: str, s: Conv2dSchedule, d: IsaDialect, epilogue: tuple[str, ...],
              a_ps: str = "MR", a_rs: str = "1", b_row: str = "NR") -> str:
    """MR rows (weights, broadcast) x NR pixels (vectors); C rows are ``ldc`` apart.

    Weight (row r, reduction step p) is ``a[p*a_ps + r*a_rs]``; pixel row p starts at
    ``b + p*b_row`` (``NR``: a packed panel, aligned; else rows of X in place). The tile adds to
    C unless ``first`` and applies the epilogue (bias per row, a residual shaped like C) when
    ``last``.
    """
    load = "VLOAD" if b_row == "NR" else "VLOADU"
    mr = s.oc_block
    tile = Tile(tuple(str(r) for r in range(mr)), s.ow_block // d.lanes, d.lanes)
    signature = (f"static inline void {name}(long kc, const float *restrict a, "
                 "const float *restrict b, float *restrict c, long ldc, int first, int last, "
                 "const float *restrict bias, const float *restrict add)")
    spec = Store(tuple(f"c + {r} * ldc" for r in range(mr)), accumulate="!first",
                 epilogue=epilogue, epilogue_if="last",
                 operands={"bias": "VSET1(bias[{r}])", "add": "VLOADU(add + {r} * ldc + {o})"})
    return micro_kernel(signature, tile, [Loop("for (long p = 0; p < kc; p++)")],
                        f"{load}(b + p * {b_row} + {{o}})",
                        [f"a[p * ({a_ps}) + {r} * ({a_rs})]" for r in range(mr)], spec)


@dataclass(frozen=True)
class _GemmRows:
    """C expressions of a tile's bias rows and residual rows (``NULL`` when absent)."""

    bias: str
    add: str


def _gemm_block(s: Conv2dSchedule, rows: _GemmRows, ukr: str, ukr_d: str, b: str) -> str:
    """One (pixel panel, channel panel) step of the implicit GEMM: the micro-kernel straight
    into Y for a whole tile, else into a local tile merged into Y; ``b`` is the pixel panel."""
    y_at = "Y + (n * F + f0) * PQ + j0"
    if s.pack_w:
        return f"""const float *a = Ap + (g * NFP + fp) * (KTOT * MR) + pc * MR;
        if (m_cur == MR && n_cur == NR) {{
          {ukr}(k_cur, a, {b}, {y_at}, PQ, first, last, {rows.bias}, {rows.add});
        }} else {{
          {ukr}(k_cur, a, {b}, ct, NR, 1, 0, NULL, NULL);
          merge_tile(Y, ct, bias, add, n, f0, m_cur, j0, n_cur, first, last);
        }}"""
    return f"""if (m_cur == MR) {{
          const float *a = Wt + f0 * KTOT + pc;
          if (n_cur == NR) {ukr_d}(k_cur, a, {b}, {y_at}, PQ, first, last, {rows.bias}, {rows.add});
          else {{
            {ukr_d}(k_cur, a, {b}, ct, NR, 1, 0, NULL, NULL);
            merge_tile(Y, ct, bias, add, n, f0, m_cur, j0, n_cur, first, last);
          }}
        }} else {{
          {ukr}(k_cur, Ap + g * (KTOT * MR) + pc * MR, {b}, ct, NR, 1, 0, NULL, NULL);
          merge_tile(Y, ct, bias, add, n, f0, m_cur, j0, n_cur, first, last);
        }}"""


# A 1x1 stride-1 panel is a plain copy of K rows of X, so full panels can read those rows in
# place, when the micro-kernel's later passes over the panel (one per channel panel) find
# them in L1 and there are few such passes to spread the copy over. Measured on the Zen 4 VM,
# one thread: MobileNet-v2's 56x56 144->24 projection ran 10-18% faster in place with one-
# and two-vector panels (9 and 18 KiB), 1.4-2.6x slower with four-vector ones (36 KiB);
# with 96 output channels (112x112, 16->96) in place was 2-6% slower, with 256 (56x56,
# 64->256) within the noise.
_IN_PLACE_PANEL_BYTES = 24 * 1024
_IN_PLACE_MAX_CHANNELS = 32


@dataclass(frozen=True, slots=True)
class _GemmPlan:
    """Sizes and code paths of one implicit-GEMM kernel: its compile-time constants (in
    ``preamble`` order), whether its im2col panels are plain copies of X's rows (``plain``:
    1x1, stride 1, no padding) and whether full panels read those rows in place instead
    (``in_place``)."""

    constants: Mapping[str, int | str]
    plain: bool
    in_place: bool


def _gemm_plan(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> _GemmPlan:
    """The plan :func:`generate_gemm` renders ``op`` under ``s`` from."""
    dims = op.dims_dict
    cg = dims["C"] // dims["groups"]
    fg = dims["F"] // dims["groups"]
    R, S = dims["R"], dims["S"]
    k_total = cg * R * S
    kc = min(s.ic_block, cg) * R * S
    mr, nr = s.oc_block, s.ow_block
    nfp = ceil_div(fg, mr)
    pq = op.out_h * op.out_w
    tail = fg % mr != 0
    ap_floats = dims["groups"] * (nfp if s.pack_w else int(tail)) * k_total * mr
    plain = (R == 1 and S == 1 and dims["stride_h"] == 1 and dims["stride_w"] == 1
             and dims["pad_t"] == 0 and dims["pad_l"] == 0 and dims["pad_b"] == 0
             and dims["pad_r"] == 0)
    in_place = (plain and fg <= _IN_PLACE_MAX_CHANNELS and nr <= 2 * d.lanes
                and kc * nr * 4 <= _IN_PLACE_PANEL_BYTES)
    constants = {**shape_constants(op), "MR": mr, "NR": nr, "KTOT": k_total, "KC": kc, "NFP": nfp,
                 "PQ": pq, "NPP": ceil_div(pq, nr), "OFF_BP": round_up(ap_floats, ALIGN_FLOATS),
                 "BP_FLOATS": round_up(kc * nr, ALIGN_FLOATS),
                 "PACK_W": str(s.pack_w), "WB_FLOATS": ap_floats,
                 "WPACK_ITEMS": dims["groups"] * (nfp if s.pack_w else int(tail))}
    return _GemmPlan(constants, plain, in_place)


def generate_gemm(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    """The implicit-GEMM kernel: its plan (:func:`_gemm_plan`), then the C rendered from it."""
    plan = _gemm_plan(op, s, d)
    out = [preamble(d, plan.constants, s.threads), *filter(None, [scalar_helpers(op.epilogue)])]
    out.append(_GEMM_PACK_WEIGHTS)
    out.append(_GEMM_PLAIN_PANEL if plan.plain else _GEMM_IM2COL_PANEL)
    out.append(_gemm_ukr("ukr", s, d, op.epilogue))
    if not s.pack_w:
        out.append(_gemm_ukr("ukr_d", s, d, op.epilogue, "1", "KTOT"))
    if plan.in_place:
        out.append(_gemm_ukr("ukr_x", s, d, op.epilogue, b_row="PQ"))
        if not s.pack_w:
            out.append(_gemm_ukr("ukr_dx", s, d, op.epilogue, "1", "KTOT", b_row="PQ"))
    out.append(_gemm_merge_tile(op))
    out.append(_gemm_conv_body(op, s, plan.in_place))
    ws = f"OFF_BP + {s.threads}L * BP_FLOATS"
    out.append(conv2d_entries(op, s.threads, ws, prepack=bool(s.pack_w)))
    return "\n".join(out)


_GEMM_PACK_WEIGHTS = """\
/* Ap[g][fp][k][MR], k = (c, r, s) as in W's memory order, zero-padded rows. Items: (g, fp);
 * with pack_w=0 only the last (partial) panel of each group is packed, at Ap[g]. */
static void pack_weights(const float *restrict Wt, float *restrict Ap, long lo, long hi) {
  for (long t = lo; t < hi; t++) {
    const long g = PACK_W ? t / NFP : t, fp = PACK_W ? t % NFP : NFP - 1;
    float *restrict dst = Ap + t * (KTOT * MR);
    const long mvalid = MIN(MR, FG - fp * MR);
    const float *restrict src = Wt + (g * FG + fp * MR) * KTOT;
    for (long k = 0; k < KTOT; k++) {
      long r = 0;
      for (; r < mvalid; r++) dst[k * MR + r] = src[r * KTOT + k];
      for (; r < MR; r++) dst[k * MR + r] = 0.0f;
    }
  }
}
"""

_GEMM_PLAIN_PANEL = """\
/* One im2col panel: rows k0..k0+kcur of pixels j0..j0+NR of image n, group g. 1x1 stride 1
 * without padding: the panel is a plain copy of NCHW rows. */
static void pack_panel(float *restrict dst, const float *restrict X, long n, long g, long k0,
                       long kcur, long j0) {
  const long nval = MIN(NR, PQ - j0);
  for (long k = 0; k < kcur; k++) {
    const float *restrict src = X + (n * C + g * CG + k0 + k) * PQ + j0;
    long j = 0;
    for (; j < nval; j++) dst[k * NR + j] = src[j];
    for (; j < NR; j++) dst[k * NR + j] = 0.0f;
  }
}
"""

_GEMM_IM2COL_PANEL = """\
/* One im2col panel: rows k0..k0+kcur (k = (c, r, s)) of pixels j0..j0+NR of image n, group g,
 * zero outside the input (padding) and beyond the last pixel. */
static void pack_panel(float *restrict dst, const float *restrict X, long n, long g, long k0,
                       long kcur, long j0) {
  long ihb[NR], iwb[NR];
  for (long j = 0; j < NR; j++) {
    const long pix = j0 + j;
    ihb[j] = pix < PQ ? (pix / Q) * SH - PT : -(1L << 40);
    iwb[j] = pix < PQ ? (pix % Q) * SW - PL : 0;
  }
  for (long k = 0; k < kcur; k++) {
    const long kk = k0 + k, c = kk / (R * S), r = (kk / S) % R, s = kk % S;
    const float *restrict src = X + (n * C + g * CG + c) * H * W;
    for (long j = 0; j < NR; j++) {
      const long ih = ihb[j] + r * DH, iw = iwb[j] + s * DW;
      dst[k * NR + j] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? src[ih * W + iw] : 0.0f;
    }
  }
}
"""


def _gemm_merge_tile(op: OpSignature) -> str:
    """C merging a partial tile, computed into a local tile, into Y (with the epilogue)."""
    epi = epilogue_scalar(op, "v", "f", "off")
    return f"""\
static void merge_tile(float *restrict Y, const float *restrict ct, const float *restrict bias,
                       const float *restrict add, long n, long f0, long m_cur, long j0,
                       long n_cur, int first, int last) {{
  (void)bias; (void)add;
  for (long r = 0; r < m_cur; r++) {{
    const long f = f0 + r;
    for (long j = 0; j < n_cur; j++) {{
      const long off = (n * F + f) * PQ + j0 + j;
      float v = ct[r * NR + j];
      if (!first) v += Y[off];
      if (last) {{ {epi} }}
      Y[off] = v;
    }}
  }}
}}
"""


def _gemm_conv_body(op: OpSignature, s: Conv2dSchedule, in_place: bool) -> str:
    """``conv_body``: the weights packed by the team, then each thread's share of the (pixel
    panel, channel panel) steps."""
    has_bias, has_add = "bias" in op.epilogue, "add" in op.epilogue
    if s.parallel == "pixel":
        ranges = ("long pp_lo, pp_hi; split_range(NB * G * NPP, tid, nth, &pp_lo, &pp_hi);\n"
                  "  const long fp_lo = 0, fp_hi = NFP;")
    else:
        ranges = ("const long pp_lo = 0, pp_hi = NB * G * NPP;\n"
                  "  long fp_lo, fp_hi; split_range(NFP, tid, nth, &fp_lo, &fp_hi);")
    rows = _GemmRows("bias + f0" if has_bias else "NULL",
                     "add + (n * F + f0) * PQ + j0" if has_add else "NULL")
    block = _gemm_block(s, rows, "ukr", "ukr_d", "Bp")
    if in_place:  # full panels read X's rows in place: a 1x1 panel is a copy of them
        block = (f"if (in_place) {{\n          {_gemm_block(s, rows, 'ukr_x', 'ukr_dx', 'bx')}"
                 f"\n        }} else {{\n          {block}\n        }}")
        panel = ("const int in_place = n_cur == NR;\n"
                 "      const float *bx = X + (n * C + g * CG + pc) * PQ + j0;\n"
                 "      if (!in_place) pack_panel(Bp, X, n, g, pc, k_cur, j0);")
    else:
        panel = "pack_panel(Bp, X, n, g, pc, k_cur, j0);"
    return f"""\
static void conv_body(const float *restrict X, const float *restrict Wt,
                      const float *restrict bias, const float *restrict add, float *restrict Y,
                      float *ws, int tid, int nth, int packed) {{
  /* packed: Wt already holds the Ap panels (pack_w=1 only, see tc_pack_weights) */
  const float *Ap = packed ? Wt : ws;
  float *Bp = ws + OFF_BP + tid * BP_FLOATS;
  float ct[MR * NR] __attribute__((aligned(64)));
  if (!packed) {{
    long lo, hi; split_range(WPACK_ITEMS, tid, nth, &lo, &hi); pack_weights(Wt, ws, lo, hi);
  }}
  BARRIER();
  {ranges}
  if (fp_lo >= fp_hi) return;
  for (long t = pp_lo; t < pp_hi; t++) {{
    const long pp = t % NPP, g = (t / NPP) % G, n = t / (NPP * G);
    const long j0 = pp * NR, n_cur = MIN(NR, PQ - j0);
    for (long pc = 0; pc < KTOT; pc += KC) {{
      const long k_cur = MIN(KC, KTOT - pc);
      const int first = pc == 0, last = pc + KC >= KTOT;
      {panel}
      for (long fp = fp_lo; fp < fp_hi; fp++) {{
        const long f0 = g * FG + fp * MR, m_cur = MIN(MR, FG - fp * MR);
        {block}
      }}
    }}
  }}
}}
"""
