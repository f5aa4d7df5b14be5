"""The direct conv2d kernel's copies of its operands, as C text.

``pack_input`` puts the input into the zero-padded, channel-blocked ``Xb`` (from NCHW, from a
blocked input row by row, or element by element where its blocks are not the kernel's);
``pack_band`` copies only the padded rows a few row tiles read (depthwise kernels, and dense
``pf`` kernels on a padded blocked input), and the band refreshes call it before a tile;
``pack_weights`` puts the weights into the blocked ``Wb``. :func:`pack_code` picks what a
:class:`DirectPlan` needs.
"""

from __future__ import annotations

from tunecache.compiler.kinds.conv2d.direct_plan import DirectPlan

_DW_PACK_INPUT = """\
/* Xb[n][cb][hp][wp][OCB]: zero-padded, channels blocked across groups. Items: (n, cb, hp). */
static void pack_input(const tx_t *restrict X, float *restrict Xb, long lo, long hi,
                       const float *xq) {
  (void)xq;  /* a narrow X widened by TX (a uint8 one with xq = [scale, zero point]) */
  for (long t = lo; t < hi; t++) {
    const long hp = t % HP, cb = (t / HP) % NCB, n = t / (HP * NCB);
    float *restrict dst = Xb + t * (WP * OCB);
    const long ih = hp - PT;
    if (ih < 0 || ih >= H) { memset(dst, 0, sizeof(float) * WP * OCB); continue; }
    memset(dst, 0, sizeof(float) * PL * OCB);
    memset(dst + (PL + W) * OCB, 0, sizeof(float) * (WP - PL - W) * OCB);
    for (long o = 0; o < OCB; o++) {
      const long c = cb * OCB + o;
      if (c >= C) { for (long iw = 0; iw < W; iw++) dst[(PL + iw) * OCB + o] = 0.0f; continue; }
      const tx_t *restrict src = X + ((n * C + c) * H + ih) * W;
      for (long iw = 0; iw < W; iw++) dst[(PL + iw) * OCB + o] = TX(src[iw]);
    }
  }
}
"""

_DW_PACK_WEIGHTS = """
/* Wb[cb][r][s][OCB]. Items: cb. */
static void pack_weights(const float *restrict Wt, float *restrict Wb, long lo, long hi) {
  for (long cb = lo; cb < hi; cb++)
    for (long rs = 0; rs < R * S; rs++)
      for (long o = 0; o < OCB; o++) {
        const long c = cb * OCB + o;
        Wb[(cb * R * S + rs) * OCB + o] = c < C ? Wt[c * R * S + rs] : 0.0f;
      }
}
"""

_DENSE_PACK_INPUT = """\
/* Xb[n][g][cb][hp][wp][ICB]: zero-padded, channel-blocked. Items: (n, g, cb, hp). */
static void pack_input(const tx_t *restrict X, float *restrict Xb, long lo, long hi,
                       const float *xq) {
  (void)xq;
  for (long t = lo; t < hi; t++) {
    const long hp = t % HP, cb = (t / HP) % NCB, g = (t / (HP * NCB)) % G;
    const long n = t / (HP * NCB * G);
    float *restrict dst = Xb + t * (WP * ICB);
    const long ih = hp - PT;
    if (ih < 0 || ih >= H) { memset(dst, 0, sizeof(float) * WP * ICB); continue; }
    memset(dst, 0, sizeof(float) * PL * ICB);
    memset(dst + (PL + W) * ICB, 0, sizeof(float) * (WP - PL - W) * ICB);
    for (long c = 0; c < ICB; c++) {
      const long ci = cb * ICB + c;
      if (ci >= CG) { for (long iw = 0; iw < W; iw++) dst[(PL + iw) * ICB + c] = 0.0f; continue; }
      const float *restrict src = X + ((n * C + g * CG + ci) * H + ih) * W;
      for (long iw = 0; iw < W; iw++) dst[(PL + iw) * ICB + c] = src[iw];
    }
  }
}
"""

_DENSE_PACK_WEIGHTS = """
/* Wb[g][fb][cb][r][s][ICB][OCB]. Items: (g, fb). */
static void pack_weights(const float *restrict Wt, float *restrict Wb, long lo, long hi) {
  for (long t = lo; t < hi; t++) {
    const long g = t / NFB, fb = t % NFB;
    float *restrict dst = Wb + t * (NCB * R * S * ICB * OCB);
    /* Write OCB-long runs; the OCB source rows read per step stay in L1 across (c, rs). */
    const long fvalid = MIN(OCB, FG - fb * OCB);
    for (long cb = 0; cb < NCB; cb++)
      for (long c = 0; c < ICB; c++) {
        const long ci = cb * ICB + c;
        for (long rs = 0; rs < R * S; rs++) {
          float *restrict d = dst + ((cb * R * S + rs) * ICB + c) * OCB;
          const float *restrict src = Wt + ((g * FG + fb * OCB) * CG + ci) * R * S + rs;
          long o = 0;
          if (ci < CG)
            for (; o < fvalid; o++) d[o] = src[o * CG * R * S];
          for (; o < OCB; o++) d[o] = 0.0f;
        }
      }
  }
}
"""

# A blocked input whose blocks are the kernel's channel blocks, with a zero border: one
# memcpy per row instead of NCHW's per-element transposition.
_PADDED_ROWS = """\
/* dst[r][wp][XI] = padded rows hp0 + r (r < rows) of input block nb (image and block); a
   narrow X (X_NARROW) widened by TX on the way. */
static inline void padded_rows(float *restrict dst, const tx_t *restrict X, long nb, long hp0,
                               long rows, const float *xq) {
  (void)xq;
  for (long r = 0; r < rows; r++, dst += WP * XI) {
    const long ih = hp0 + r - PT;
    if (ih < 0 || ih >= H) { memset(dst, 0, sizeof(float) * WP * XI); continue; }
    memset(dst, 0, sizeof(float) * PL * XI);
#if X_NARROW
    const tx_t *restrict src = X + (nb * H + ih) * (W * XI);
    for (long i = 0; i < W * XI; i++) dst[PL * XI + i] = TX(src[i]);
#else
    memcpy(dst + PL * XI, X + (nb * H + ih) * (W * XI), sizeof(float) * W * XI);
#endif
    memset(dst + (PL + W) * XI, 0, sizeof(float) * (WP - PL - W) * XI);
  }
}
"""

_ROWS_PACK_INPUT = _PADDED_ROWS + """\
/* Xb[n][b][hp][wp][XI]: the blocked input with its zero border. Items: (n, b, hp). */
static void pack_input(const tx_t *restrict X, float *restrict Xb, long lo, long hi,
                       const float *xq) {
  for (long t = lo; t < hi; t++)
    padded_rows(Xb + t * (WP * XI), X, t / HP, t % HP, 1, xq);
}
"""

# A depthwise layer reads each input row only for the few output rows next to it: packing
# the whole padded input first wrote a copy as large as the input (5 MB for MobileNet-v2's
# 112x112 stride-2 layer) that left the caches before the tiles read it back, and in a
# model, where that buffer is cold, its writes cost as much as the convolution.
_BAND_PACK_INPUT = _PADDED_ROWS + """\
/* band[r][wp][XI] = padded rows hp0 + r (r < rows) of input block nb (image and block). */
static void pack_band(const tx_t *restrict X, float *restrict band, long nb, long hp0,
                      long rows, const float *xq) {
  padded_rows(band, X, nb, hp0, rows, xq);
}
"""

# A dense pf kernel reads a row tile's input rows for every output-channel block before it
# moves on: copying them (every channel block) into a small band just before, instead of the
# whole padded input once per call, keeps the copy's writes and the tiles' reads in cache. The
# whole copy (1.7 MB for ResNet-50's 128-channel stride-2 layer) cost 12-14% of that layer's
# time alone, its writes leaving L2 before the tiles read them back (change 80).
_DENSE_BAND_PACK_INPUT = _PADDED_ROWS + """\
/* band[cb][r][wp][XI] = padded rows hp0 + r (r < rows) of every input block of image n. */
static void pack_band(const tx_t *restrict X, float *restrict band, long n, long hp0,
                      long rows, const float *xq) {
  for (long cb = 0; cb < CBX; cb++)
    padded_rows(band + cb * (BAND_ROWS * WP * XI), X, n * CBX + cb, hp0, rows, xq);
}
"""

_GATHER_PACK_INPUT = _DENSE_PACK_INPUT.replace(
    "Xb[n][g][cb][hp][wp][ICB]: zero-padded, channel-blocked.",
    "Xb[n][g][cb][hp][wp][ICB] from the blocked input: zero-padded.",
).replace(
    "const float *restrict src = X + ((n * C + g * CG + ci) * H + ih) * W;\n"
    "      for (long iw = 0; iw < W; iw++) dst[(PL + iw) * ICB + c] = src[iw];",
    "const long cx = g * CG + ci;\n"
    "      const float *restrict src = X + ((n * CBX + cx / XI) * H + ih) * W * XI + cx % XI;\n"
    "      for (long iw = 0; iw < W; iw++) dst[(PL + iw) * ICB + c] = src[iw * XI];",
)


def pack_code(plan: DirectPlan) -> str:
    """``pack_input`` (none for a ``view``), ``pack_weights`` and their item counts."""
    if plan.depthwise:
        weights, witems = _DW_PACK_WEIGHTS, "NCB"
        inputs, items = _DW_PACK_INPUT, "(NB * NCB * HP)"
    else:
        weights, witems = _DENSE_PACK_WEIGHTS, "(G * NFB)"
        inputs, items = _DENSE_PACK_INPUT, "(NB * G * NCB * HP)"
    if plan.source == "rows":
        inputs, items = _ROWS_PACK_INPUT, "(NB * CBX * HP)"
    elif plan.source == "band":
        inputs, items = (_BAND_PACK_INPUT if plan.depthwise else _DENSE_BAND_PACK_INPUT), "0"
    elif plan.source == "gather":
        inputs = _GATHER_PACK_INPUT
    elif plan.source == "view":
        inputs, items = "", "0"
    return f"{inputs}{weights}#define PACK_ITEMS {items}\n#define WPACK_ITEMS {witems}\n"


DENSE_BAND_REFRESH = """
      if (n != band_nb || p0 != band_p0) {
        pack_band(X, band, n, p0 * SH, MIN(BAND_ROWS, HP - p0 * SH), xq);
        band_nb = n;
        band_p0 = p0;
      }"""

BAND_REFRESH = """
      const long nb = n * CBX + (gf * OCB) / XI;
      if (nb != band_nb || p0 < band_p0 || p0 >= band_p0 + BAND_TILES * TH) {
        pack_band(X, band, nb, p0 * SH, MIN(BAND_ROWS, HP - p0 * SH), xq);
        band_nb = nb;
        band_p0 = p0;
      }"""
