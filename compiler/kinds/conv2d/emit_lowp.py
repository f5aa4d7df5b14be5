"""C code of the int8 and bf16 conv2d kernels (``dtype=int8|bf16``, a ``direct`` schedule).

Dense convolutions (one group, no dilation) of float32 activations: each call quantizes X
with ``qa = [scale, zero point]`` into ``Xq[N][CB][Hp][Wp][PIXC]`` (uint8, ``PIXC`` channels
a pixel block, the border and the channels past C filled with the zero point, which the
zero-point term of the bias already accounts for) — for bf16, rounds X to bfloat16 there,
the border and spare channels zero. ``PIXC`` is 16 for the vector kernel and one tile row
(64 bytes) for the tile kernel (``loop_order=amx``, :mod:`.emit_tiles`). In the vector
kernel each thread takes (image, ``oc_block`` tile, output row) items: a register tile of
``ow_block`` pixels x ``oc_block / lanes`` vectors of int32 accumulators sums, for every
channel block, tap and ``IGROUP`` of channels, the dialect's dot product of the pixel's
``IGROUP`` broadcast channels with a vector of packed weights (``IsaDialect.int8``:
``vpdpbusd`` with VNNI; ``IsaDialect.bf16``: ``vdpbf16ps`` with AVX512-BF16, float32
accumulators). The weights (int8 or bfloat16 ``[F][C][R][S]``) are packed once into
``[F/oc_block][CB][R][S][PIXC/IGROUP][oc_block][IGROUP]``. The epilogue (``dequant``
per-channel scales, ``bias``, a residual ``add``, an activation, then chain steps and a
residual ``radd``) runs on whole vectors of output channels into Y in its layout.
``ic_block`` (the tile kernel's ``PIXC``), ``loop_order`` (``amx`` or not) and ``parallel``
are the other knobs (``lowp_problems``).
"""

from __future__ import annotations

from tunecache.compiler.codegen.abi import PackedWeights, kernel_entries, preamble
from tunecache.compiler.codegen.epilogue import (
    CHANNEL_OPERAND,
    chain_rows,
    operand_tensors,
    render,
    scalar_helpers,
)
from tunecache.compiler.codegen.isa import BF16_SCALAR, IsaDialect
from tunecache.compiler.kinds import narrow_tensors
from tunecache.compiler.kinds.conv2d.common import shape_constants, y_storage
from tunecache.compiler.kinds.conv2d.emit_tiles import tile_plane, tile_row
from tunecache.compiler.kinds.conv2d.lowp import (
    narrow_type,
    packed_channels,
    pixel_channels,
    reads_x_in_place,
    subsamples,
    tiles_plane,
)
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule
from tunecache.compiler.kinds.layouts import channel_block
from tunecache.compiler.kinds.matmul.emit_tiles import TILE_BYTES, TILE_ROWS
from tunecache.compiler.ops import OpSignature

TYPES = {"int8": ("uint8_t", "int8_t", "int32_t"), "bf16": ("uint16_t", "uint16_t", "float")}
"""C types of the packed input, the weights as given and the accumulators, per dtype."""

WQ_CHUNK_BYTES = 512 * 1024
"""The packed weights a chunk of channel tiles may hold (``TCH``): half of a 1 MiB L2, the
smallest on machines with int8 or bf16 dot products (2 MiB on AMX Xeons)."""

_TYPES = """\
/* Xq's pixels: KC channels (C, or the S taps of C channels when WIDE) in blocks of PIXC,
   KS taps a row loop walks, KSW columns between output pixels, KWP columns a row. */
#define CB ((KC + PIXC - 1) / PIXC)
#define GPB (PIXC / IGROUP)
#define FT ((FOUT + OCB - 1) / OCB)  /* FOUT: F, or a blocked Y's F with its spare lanes */
/* a row narrower than a tile reads past its end: slack for the last row; IN_PLACE: X is
   Xq already (reads_x_in_place), not packed */
#define XQ_BYTES (IN_PLACE ? 0 : \
  (((long)NB * CB * HP * KWP + OWB * KSW + S) * PIXC * (long)sizeof(ta_t) + 63) / 64 * 64)
#define WQ_ITEMS ((long)FT * CB * R * KS * GPB * OCB * IGROUP)
/* Rows sweep the channel tiles in chunks of TCH whose packed weights fit WQ_CHUNK_BYTES: a
   row's pixels are read for every tile of the chunk while in L1, the chunk's weights stay
   in L2 across the rows, and Xq is swept once a chunk (not once a tile). */
#define WQ_TILE_BYTES ((long)CB * R * KS * GPB * OCB * IGROUP * (long)sizeof(ib_t))
#define TCH (WQ_TILE_BYTES >= WQ_CHUNK_BYTES ? 1 : MIN(FT, WQ_CHUNK_BYTES / WQ_TILE_BYTES))
#define NCH ((FT + TCH - 1) / TCH)
/* the offset of pixel (h, w) of X's plane or channel block b, in pixels: the packing reads
   X where it lies (XH x XW), every XSH-th row and XSW-th column (a subsampled plane) */
#define XOFF(b, h, w) (((b) * XH + (h) * XSH) * XW + (w) * XSW)
"""

_PACK_W = """\
/* W (F x C x R x S) into [FT][CB][R][KS][GPB][OCB][IGROUP] of ib_t, zero-padded; a WIDE
   pixel's channel k is tap k / C of channel k % C. */
static void tc_q_pack_w(const tb_t *w, ib_t *wp) {
  long i = 0;
  for (long t = 0; t < FT; t++)
    for (long cb = 0; cb < CB; cb++)
      for (long r = 0; r < R; r++)
        for (long s = 0; s < KS; s++)
          for (long g = 0; g < GPB; g++)
            for (long o = 0; o < OCB; o++)
              for (long e = 0; e < IGROUP; e++, i++) {
                const long f = t * OCB + o, k = cb * PIXC + g * IGROUP + e;
                const long c = WIDE ? k % C : k, tap = WIDE ? k / C : s;
                wp[i] = (f < F && k < KC) ? IB_FROM(w[((f * C + c) * R + r) * S + tap]) : 0;
              }
}
"""

_CONVERT = {
    # saturate x / scale to [-z, 255 - z], round half to even (add and take away 1.5 * 2**23),
    # add z; the border and the channels past C (zeros in X) are z
    "int8": ("""\
static inline ta_t tc_q_one(float x, float scale, float z) {
  float v = x / scale;
  v = v >= -z ? v : -z;
  v = v <= 255.0f - z ? v : 255.0f - z;
  return (ta_t)(int)((v + 12582912.0f) - 12582912.0f + z);
}""", "const float scale = qa[0], z = qa[1];\n  const ta_t fill = (ta_t)(int)z;",
             "tc_q_one(X_AT, scale, z)"),
    # bfloat16 (BF16_SCALAR's rounding); the border and the channels past C are zero
    "bf16": ("", "(void)qa;\n  const ta_t fill = 0;", "tc_bf16_round(X_AT)"),
}
"""Per dtype: the helper converting one float of X as Xq holds it (int8's ``tc_q_one``;
bf16's is :data:`BF16_SCALAR`'s ``tc_bf16_round``), the packing's setup (``fill``: Xq's
border) and the call converting ``X_AT``."""
_NARROW_X = {"int8": ("", "const ta_t fill = (ta_t)(int)qa[1];", "X_AT"),
             "bf16": ("", "(void)qa;\n  const ta_t fill = 0;", "X_AT")}
"""``_CONVERT`` for an X held narrow (already uint8 or bfloat16, its elements copied)."""

_BLOCK_X = """\
/* X's rows [lo, hi) of (n, cb, hp) into Xq; the border holds the fill (memset: a byte, as
   bf16's fill is 0); the row's W pixels of PIXC channels cb * PIXC + k follow. */
static void tc_q_pack_x(const tx_t *X, const float *qa, ta_t *Xq, long lo, long hi) {
  %s
  for (long item = lo; item < hi; item++) {
    const long hp = item %% HP, cb = item / HP %% CB, n = item / HP / CB, h = hp - PT;
    ta_t *restrict row = Xq + item * WP * PIXC;
    if (R < SH && hp %% SH >= R) continue;  /* a row no tap reads (a strided 1x1) */
    if (h < 0 || h >= H) {
      memset(row, fill, WP * PIXC * sizeof(ta_t));
      continue;
    }
    memset(row, fill, PL * PIXC * sizeof(ta_t));
    memset(row + (PL + W) * PIXC, fill, (WP - PL - W) * PIXC * sizeof(ta_t));
%s
  }
}
"""
_PIXELS = """\
    for (long w = 0; w < W; w++) {
      ta_t *restrict out = row + (PL + w) * PIXC;
%s
    }"""
"""Pixel by pixel: ``%s`` converts the PIXC channels of (h, w) into ``out``."""
# a plain X: channel by channel, each plane's row read in order (pixel by pixel, a pixel's
# PIXC channels lay H * W apart: the 24-channel activations of a quantized MobileNet took
# 0.1 ms a layer to pack so)
_PLANES = """\
    const long live = MIN(PIXC, C - cb * PIXC);  /* channels past C: the fill */
    if (live < PIXC) memset(row + PL * PIXC, fill, W * PIXC * sizeof(ta_t));
    for (long k = 0; k < live; k++) {
      ta_t *restrict out = row + PL * PIXC + k;
      const tx_t *restrict src = X + XOFF(n * C + cb * PIXC + k, h, 0);
      for (long w = 0; w < W; w++) out[w * PIXC] = %s;
    }"""
_SCALAR_PIXEL = "      for (long k = 0; k < PIXC; k++) out[k] = %s;"
# int8 from a channel-blocked X whose blocks hold whole vectors: tc_q_one's steps on LANES
# channels at a time (NaN to the low end, ties to even), the same bytes.
_VECTOR_SETUP = """\
const vec vs = VSET1(scale), vlo = VSET1(-z), vhi = VSET1(255.0f - z), vz = VSET1(z);
  const vec vm = VSET1(12582912.0f);"""
_VECTOR_PIXEL = """\
      for (long k = 0; k < PIXC; k += LANES) {
        const long c = cb * PIXC + k;
        if (c >= %d) {  /* past X's padded channels: the zero point */
          memset(out + k, fill, LANES);
          continue;
        }
        vec v = VMAX(VDIV(VLOADU(X + XOFF(n * %d + c / %d, h, w) * %d + c %% %d), vs),
                     vlo);
        v = VMIN(v, vhi);
        VSTORE_U8(out + k, VADD(VSUB(VADD(v, vm), vm), vz));
      }"""
# bf16 from a channel-blocked X: X's blocks of XB channels converted whole (whole vectors
# by VSTORE_BF16, else tc_bf16_round's loop; both round to nearest even), blocks past X's padded
# channels zero.
_BLOCKED_PIXEL = """\
      for (long k = 0; k < PIXC; k += %(x)d) {
        const long c = cb * PIXC + k;
        if (c >= %(padded)d) {
          memset(out + k, 0, %(x)d * sizeof(ta_t));
          continue;
        }
        const float *src = X + XOFF(n * %(blocks)d + c / %(x)d, h, w) * %(x)d;
        if (%(x)d %% LANES == 0)
          for (long e = 0; e < %(x)d; e += LANES) VSTORE_BF16(out + k + e, VLOADU(src + e));
        else
          for (long e = 0; e < %(x)d; e++) out[k + e] = tc_bf16_round(src[e]);
      }"""
# a narrow X, channel-blocked: each of X's blocks of XB channels copied whole (the fill a
# byte: bf16's is 0).
_NARROW_PIXEL = """\
      for (long k = 0; k < PIXC; k += %(x)d) {
        const long c = cb * PIXC + k;
        if (c >= %(padded)d)
          memset(out + k, fill, %(x)d * sizeof(ta_t));
        else
          memcpy(out + k, X + XOFF(n * %(blocks)d + c / %(x)d, h, w) * %(x)d,
                 %(x)d * sizeof(ta_t));
      }"""
_WIDE_X = """\
/* WIDE: X's rows [lo, hi) of (n, cb, hp) into Xq, output column q's pixel holding the S
   taps of the C channels it reads (channel k: tap k / C of channel k %% C). Row h is
   converted once into qrow pixel-major (WP x C, the border at the fill; C < PIXC here), so
   column q's KC channels are qrow's KC elements from q * SW * C, copied whole; channels past
   KC hold the fill. */
static void tc_q_pack_x(const tx_t *X, const float *qa, ta_t *Xq, long lo, long hi) {
  %s
  ta_t qrow[WP * C];
  for (long item = lo; item < hi; item++) {
    const long hp = item %% HP, cb = item / HP %% CB, n = item / HP / CB, h = hp - PT;
    ta_t *restrict row = Xq + item * KWP * PIXC;
    if (R < SH && hp %% SH >= R) continue;  /* a row no tap reads */
    for (long i = 0; i < WP * C; i++) qrow[i] = fill;
    if (h >= 0 && h < H)
      for (long w = 0; w < W; w++)
        for (long c = 0; c < C; c++) qrow[(PL + w) * C + c] = %s;
    const long first = cb * PIXC, live = MIN(PIXC, KC - first);
    for (long q = 0; q < KWP; q++) {
      memcpy(row + q * PIXC, qrow + q * SW * C + first, live * sizeof(ta_t));
      /* the channels past the last live one: the fill, a byte (bf16's is 0) */
      if (live < PIXC) memset(row + q * PIXC + live, fill, (PIXC - live) * sizeof(ta_t));
    }
  }
}
"""

_BODY = """\
  long lo, hi;
%s
%s
  BARRIER();
  split_range((long)NB * NCH * ROWS * TCH, TID, NTH, &lo, &hi);
%s  for (long item = lo; item < hi; item++) {
    const long t = item / TCH / ROWS %% NCH * TCH + item %% TCH;
    if (t < FT)
      tc_q_row(Xq, Wq, scale, bias, (const tadd_t *)add, aq, chan, (ty_t *)Y,
               item / TCH / ROWS / NCH, t, item / TCH %% ROWS);
  }
%s"""
_PACK_X = """\
  ta_t *Xq = (ta_t *)ws;
  split_range((long)NB * CB * HP, TID, NTH, &lo, &hi);
  tc_q_pack_x((const tx_t *)X, qa, Xq, lo, hi);"""
_X_IN_PLACE = "  const ta_t *Xq = (const ta_t *)X;\n  (void)qa;"


def _body(once: bool, config: str, in_place: bool) -> str:
    """The kernel's body: X packed (or read in place), the weights (packed once, or here),
    the rows; a tile kernel's ``config`` of its thread's tiles around them."""
    return _BODY % (_X_IN_PLACE if in_place else _PACK_X,
                    _PACKED_ONCE if once else _PACK_PER_CALL, config,
                    "  TRELEASE();\n" if config else "")


def _tile_config(op: OpSignature, s: Conv2dSchedule, pixc: int) -> str:
    """The tile kernel's ``TCONFIG``: a K step of a whole tile row, or of ``pixc``'s bytes
    in its A tiles (after the C tiles) and as many B rows (:func:`tile_pixel_channels`)."""
    if s.loop_order != "amx":
        return ""
    kb, mt = pixc * op.dtype_bytes, s.ow_block // TILE_ROWS
    if kb == TILE_BYTES:
        return "  TCONFIG();\n"
    first_a = mt * (s.oc_block // TILE_ROWS)
    return f"  TCONFIG_K({first_a}, {first_a + mt}, {kb});\n"


_PACK_PER_CALL = """\
  ib_t *Wq = (ib_t *)((char *)ws + XQ_BYTES);
  if (TID == 0) tc_q_pack_w((const tb_t *)Wt, Wq);"""
_PACKED_ONCE = "  const ib_t *Wq = (const ib_t *)Wt;"


def _x_channel(op: OpSignature) -> str:
    """X's element for channel ``c`` (below C) of pixel (n, h, w), in X's layout, as C."""
    x = channel_block(op.attr("layout"))
    if not x:
        return "X[XOFF(n * C + c, h, w)]"
    return f"X[XOFF(n * {-(-op.dim('C') // x)} + c / {x}, h, w) * {x} + c % {x}]"


def _pack_x(op: OpSignature, lanes: int, pixc: int) -> str:
    """``tc_q_pack_x`` for ``op``: whole ``pixc``-channel blocks of X's pixels (int8 from a
    channel-blocked X a vector at a time), or WIDE pixels."""
    narrow = "x" in narrow_tensors(op)
    helper, setup, one = (_NARROW_X if narrow else _CONVERT)[op.dtype]
    if packed_channels(op.dim("C"), op.dim("S"), pixc) != (op.dim("C"), op.dim("S")):
        return helper + "\n" + _WIDE_X % (setup, one.replace("X_AT", _x_channel(op)))
    x, c = channel_block(op.attr("layout")), op.dim("C")
    if narrow and x and pixc % x == 0:
        pixel = _NARROW_PIXEL % {"x": x, "padded": -(-c // x) * x, "blocks": -(-c // x)}
        return _BLOCK_X % (setup, _PIXELS % pixel)
    # Every vector within one block of X; vectors past X's padded channels hold the fill.
    if op.dtype == "int8" and x and x % lanes == 0 and not narrow:
        pixel = _VECTOR_PIXEL % (-(-c // x) * x, -(-c // x), x, x, x)
        return helper + "\n" + _BLOCK_X % (setup + "\n  " + _VECTOR_SETUP, _PIXELS % pixel)
    if op.dtype == "bf16" and x and pixc % x == 0:
        pixel = _BLOCKED_PIXEL % {"x": x, "padded": -(-c // x) * x, "blocks": -(-c // x)}
        return helper + "\n" + _BLOCK_X % (setup, _PIXELS % pixel)
    if not x:
        return helper + "\n" + _BLOCK_X % (setup, _PLANES % one.replace("X_AT", "src[w * XSW]"))
    pixel = _SCALAR_PIXEL % one.replace("X_AT", _x_index(op, pixc, "fill" if narrow else "0.0f"))
    return helper + "\n" + _BLOCK_X % (setup, _PIXELS % pixel)


def _x_index(op: OpSignature, pixc: int, past: str) -> str:
    """X's element for channel ``cb * PIXC + k`` of pixel (n, h, w), ``past`` past C:
    ``pixc`` contiguous elements a pixel when X's blocks are that wide."""
    x, c = channel_block(op.attr("layout")), op.dim("C")
    if x == pixc:
        return f"X[XOFF(n * {-(-c // x)} + cb, h, w) * {x} + k]"
    if x:
        return (f"(cb * PIXC + k < {-(-c // x) * x} ? X[XOFF(n * {-(-c // x)} + (cb * PIXC + k)"
                f" / {x}, h, w) * {x} + (cb * PIXC + k) % {x}] : {past})")
    return f"(cb * PIXC + k < C ? X[XOFF(n * C + cb * PIXC + k, h, w)] : {past})"


def _y_index(op: OpSignature) -> str:
    """Y's element (n, f, oh, ow) in its layout, as C."""
    x = channel_block(op.attr("out_layout"))
    if not x:
        return "((n * F + f) * P + oh) * Q + ow"
    return f"(((n * {-(-op.dim('F') // x)} + f / {x}) * P + oh) * Q + ow) * {x} + f % {x}"


def _operands(op: OpSignature, part: bool) -> tuple[dict[str, str], dict[str, str]]:
    """Where ``tc_q_store``'s epilogue reads its operands, as vector C (the first ``m`` lanes
    when ``part``) and as scalar C: a uint8 residual dequantized with ``aq``."""
    load = "VLOADU_PART({p}, m)" if part else "VLOADU({p})"
    vector = {"scale": load.format(p="scale + f"), "bias": load.format(p="bias + f"),
              "add": "VLOADU(add + at)", CHANNEL_OPERAND: load.format(p="chan + {i} * F + f")}
    scalar = {"scale": "scale[f]", "bias": "bias[f]", "add": "add[at]",
              CHANNEL_OPERAND: "chan[{i} * F + f]"}
    if "add" in narrow_tensors(op) and op.dtype == "bf16":
        vector["add"], scalar["add"] = "VLOAD_BF16(add + at)", "tc_bf16_value(add[at])"
    elif "add" in narrow_tensors(op):
        vector["add"] = "VMUL(VSUB(VLOAD_U8(add + at), VSET1(aq[1])), VSET1(aq[0]))"
        scalar["add"] = "(((float)add[at] - aq[1]) * aq[0])"
    return vector, scalar


def _finish(op: OpSignature, d: IsaDialect) -> str:
    """``tc_q_store``: one pixel's ``OCB`` accumulators (channels ``f0..``), epilogue
    applied, into Y (``ty_t``, stored by ``TY_STORE``/``TY``): whole vectors where Y holds
    ``LANES`` channels contiguously."""
    operands, scalars = _operands(op, False)
    vector = render(op.epilogue, "v", operands, vector=True)
    scalar = render(op.epilogue, "u", scalars, vector=False)
    part = render(op.epilogue, "v", _operands(op, True)[0], vector=True)
    blocked = channel_block(op.attr("out_layout")) % d.lanes == 0 and \
        channel_block(op.attr("out_layout")) > 0
    # A blocked Y holds LANES channels contiguously; its last block's lanes past F are zero.
    whole = (f"    if (f + LANES <= F) {{\n      vec v = VCVTI(acc + j);\n      {vector}\n"
             "      TY_STORE(Y + at, v);\n      continue;\n    }\n"
             f"    if (f < F) {{\n      const int m = (int)(F - f);\n      vec v = VCVTI(acc + j);\n"
             f"      {part}\n      TY_STORE(Y + at, VFILL_PART(v, m, 0.0f));\n      continue;\n"
             "    }\n") if blocked else ""
    if not channel_block(op.attr("out_layout")):
        whole = _plain_vectors(op)
    padded = "FOUT"  # a blocked Y's channels past F are zeros, as every kernel leaves them
    return ("static inline void tc_q_store(const tacc_t *acc, const float *scale,\n"
            "    const float *bias, const tadd_t *add, const float *aq, const float *chan,\n"
            "    ty_t *Y, long n, long f0, long oh, long ow) {\n"
            "  (void)add; (void)aq; (void)chan;\n"
            f"  for (long j = 0; j < OCB && f0 + j < {padded}; j += LANES) {{\n"
            "    long f = f0 + j, at = " + _y_index(op) + ";\n" + whole
            + f"    for (long k = 0; k < LANES && f0 + j + k < {padded}; k++) {{\n"
              "      f = f0 + j + k;\n      at = " + _y_index(op) + ";\n"
              "      if (f >= F) {\n        Y[at] = TY(0.0f);\n        continue;\n      }\n"
              f"      float u = (float)acc[j + k];\n      {scalar}\n      Y[at] = TY(u);\n"
              "    }\n  }\n}\n")


def _plain_vectors(op: OpSignature) -> str:
    """``tc_q_store``'s vector path into a plain Y: the epilogue on a vector of channels
    (the last one's first ``m`` lanes) and each lane stored to its channel's plane; a
    residual gathered from those planes first (a quantized MobileNet's 24-channel 1x1s
    add theirs: element by element they spent 0.46 of 0.48 ms in the epilogue)."""
    held = narrow_tensors(op)
    gather = "add[at + k * (long)P * Q]"
    if "add" in held:
        gather = {"uint8": "(float)%s", "bfloat16": "tc_bf16_value(%s)"}[narrow_type(op)] % gather
    vector, _ = _operands(op, False)
    part, _ = _operands(op, True)
    if "add" in operand_tensors(op.epilogue):
        taken = "VLOAD(ta)"
        if "add" in held and op.dtype == "int8":
            taken = "VMUL(VSUB(VLOAD(ta), VSET1(aq[1])), VSET1(aq[0]))"
        vector["add"] = part["add"] = taken
    residual = ("      float ta[LANES] __attribute__((aligned(64)));\n"
                f"      for (long k = 0; k < LANES; k++) ta[k] = k < m ? {gather} : 0.0f;\n"
                if "add" in operand_tensors(op.epilogue) else "")
    return ("    if (f < F) {\n      const int m = (int)MIN(LANES, F - f);\n" + residual
            + "      vec v = VCVTI(acc + j);\n"
            f"      if (m == LANES) {{\n        {render(op.epilogue, 'v', vector, vector=True)}\n"
            f"      }} else {{\n        {render(op.epilogue, 'v', part, vector=True)}\n      }}\n"
            "      float t[LANES] __attribute__((aligned(64)));\n      VSTORE(t, v);\n"
            "      for (long k = 0; k < m; k++) Y[at + k * (long)P * Q] = TY(t[k]);\n"
            "      continue;\n    }\n")


def _plain_block(op: OpSignature, d: IsaDialect) -> str:
    """``tc_q_store_block``'s path into a plain Y for a tile of consecutive pixels of the
    plane: channel by channel, ``LANES`` pixels a vector (gathered down the tile's column
    of accumulators), the per-channel operands broadcast, a residual and Y read and written
    along the plane. Pixel by pixel, each channel vector went out to as many planes, through
    the stack: MobileNet-v2's 144->24 1x1 with its bfloat16 residual at 56x56 took 0.23 ms,
    0.11 of it storing."""
    operands = {"scale": "VSET1(scale[f])", "bias": "VSET1(bias[f])",
                "add": _operands(op, False)[0]["add"],  # a plane's pixels, as Y's
                CHANNEL_OPERAND: "VSET1(chan[{i} * F + f])"}
    column = ", ".join(f"(float)acc[(p + {lane}) * OCB + k]" for lane in range(d.lanes))
    return ("  if (OWB % LANES == 0 && pix[0] >= 0 && pix[OWB - 1] - pix[0] == OWB - 1) {\n"
            "    for (long k = 0; k < OCB && f0 + k < F; k++) {\n"
            "      const long f = f0 + k;\n"
            "      for (long p = 0; p < OWB; p += LANES) {\n"
            "        const long at = (n * F + f) * P * Q + pix[0] + p;\n"
            f"        vec v = (vec){{{column}}};\n"
            f"        {render(op.epilogue, 'v', operands, vector=True)}\n"
            "        TY_STORE(Y + at, v);\n      }\n    }\n    return;\n  }\n")


def _store_block(op: OpSignature, d: IsaDialect) -> str:
    """``tc_q_store_block``: a tile's ``OWB`` pixels (``pix[p]``: the pixel's index in Y's
    plane, -1 for one not stored) of ``OCB`` channels from ``f0``, through the epilogue into
    Y. Into a blocked Y of whole vectors, channel vector by channel vector: its scales,
    bias and chain rows loaded once into registers for all the pixels (a store into Y may
    alias them, so per pixel the compiler reloads every one); else pixel by pixel."""
    x = channel_block(op.attr("out_layout"))
    head = ("static inline void tc_q_store_block(const tacc_t *acc, const float *scale,\n"
            "    const float *bias, const tadd_t *add, const float *aq, const float *chan,\n"
            "    ty_t *Y, long n, long f0, const long *pix) {\n"
            "  (void)add; (void)aq; (void)chan;\n")
    each = ("  for (long p = 0; p < OWB; p++)\n    if (pix[p] >= 0)\n"
            "      tc_q_store(acc + p * OCB, scale, bias, add, aq, chan, Y, n, f0, pix[p] / Q,\n"
            "                 pix[p] % Q);\n")
    if not x:
        return head + _plain_block(op, d) + each + "}\n"
    if x % d.lanes:
        return head + each + "}\n"
    vector, _ = _operands(op, False)
    rows = chain_rows(op.epilogue)
    held = {"scale": "h_scale", "bias": "h_bias", CHANNEL_OPERAND: "h_chan{i}"}
    loads = [f"    const vec {held[t]} = {vector[t]};"
             for t in ("scale", "bias") if t in operand_tensors(op.epilogue)]
    loads += [f"    const vec h_chan{i} = VLOADU(chan + {i} * F + f);" for i in range(rows)]
    epilogue = render(op.epilogue, "v", {**vector, **held}, vector=True)
    return (head + "  if (f0 + OCB > F) {\n" + each.replace("\n  ", "\n    ") + "    return;\n  }\n"
            "  for (long j = 0; j < OCB; j += LANES) {\n    const long f = f0 + j;\n"
            + "\n".join(loads) + "\n"
            f"    const long base = (n * {-(-op.dim('F') // x)} + f / {x}) * P * Q * {x} "
            f"+ f % {x};\n"
            "    for (long p = 0; p < OWB; p++) {\n      if (pix[p] < 0) continue;\n"
            f"      const long at = base + pix[p] * {x};\n"
            "      vec v = VCVTI(acc + p * OCB + j);\n"
            f"      {epilogue}\n      TY_STORE(Y + at, v);\n    }}\n  }}\n}}\n")


def _row(nv: int, owb: int) -> str:
    """``tc_q_row``: output row ``oh`` of channel tile ``t`` of image ``n``, in tiles of
    ``OWB`` pixels; the last tile ends at the row's end (overlapping the one before, whose
    pixels it does not store again), so every tile is whole."""
    acc = [f"c{p}_{v}" for p in range(owb) for v in range(nv)]
    loads = "".join(f"            const ibv_t b{v} = ILOADB(w + {v} * LANES * IGROUP);\n"
                    for v in range(nv))
    steps = "".join(
        f"            {{ const ia_t a = IBCAST(x + {p} * KSW * PIXC);\n"
        + "".join(f"              c{p}_{v} = IDOT(c{p}_{v}, a, b{v});\n" for v in range(nv))
        + "            }\n" for p in range(owb))
    stores = "".join(
        f"    if (first + {p} >= ow0 && first + {p} < Q) {{\n"
        + "".join(f"      ISTOREU(out + {v} * LANES, c{p}_{v});\n" for v in range(nv))
        + f"      tc_q_store(out, scale, bias, add, aq, chan, Y, n, t * OCB, oh, first + {p});\n"
        "    }\n"
        for p in range(owb))
    return (
        "static void tc_q_row(const ta_t *Xq, const ib_t *Wq, const float *scale,\n"
        "    const float *bias, const tadd_t *add, const float *aq, const float *chan, ty_t *Y,\n"
        "    long n, long t, long oh) {\n"
        "  tacc_t out[OCB] __attribute__((aligned(64)));\n"
        "  for (long ow0 = 0; ow0 < Q; ow0 += OWB) {\n"
        "    const long first = Q >= OWB ? MIN(ow0, Q - OWB) : 0;\n"
        f"    ivec {', '.join(f'{c} = IZERO()' for c in acc)};\n"
        "    const ib_t *w = Wq + t * CB * R * KS * GPB * OCB * IGROUP;\n"
        "    for (long cb = 0; cb < CB; cb++)\n"
        "      for (long r = 0; r < R; r++)\n"
        "        for (long s = 0; s < KS; s++) {\n"
        "          const ta_t *xs = Xq + (((n * CB + cb) * HP + oh * SH + r) * KWP\n"
        "                                 + first * KSW + s) * PIXC;\n"
        "          for (long g = 0; g < GPB; g++, w += OCB * IGROUP) {\n"
        "            const ta_t *x = xs + g * IGROUP;\n"
        + loads + steps + "          }\n        }\n"
        + stores + "  }\n}\n")


def generate_lowp_conv(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    """The int8 or bf16 kernel of ``op`` under the (legal) direct schedule ``s`` in dialect
    ``d``."""
    x = channel_block(op.attr("out_layout"))
    pixc, tiles = pixel_channels(op, s), s.loop_order == "amx"
    kc, ks = packed_channels(op.dim("C"), op.dim("S"), pixc)
    wide = ks != op.dim("S")
    shape = _shape(op, tiles)
    plane = tiles and tiles_plane(op)
    rows = -(-op.out_h * int(shape["WP"]) // s.ow_block) if plane else op.out_h
    constants = {**shape, "OCB": s.oc_block, "OWB": s.ow_block, "PIXC": pixc, "ROWS": rows,
                 "LANES": d.lanes, "FOUT": -(-op.dim("F") // x) * x if x else op.dim("F"),
                 "KC": kc, "KS": ks, "WIDE": int(wide), "KSW": 1 if wide else shape["SW"],
                 "KWP": op.out_w if wide else "WP", "WQ_CHUNK_BYTES": WQ_CHUNK_BYTES}
    in_place = reads_x_in_place(op, s)
    constants["IN_PLACE"] = int(in_place)
    packed = PackedWeights("((WQ_ITEMS * (long)sizeof(ib_t) + 3) / 4)",
                           "  tc_q_pack_w((const tb_t *)weights, (ib_t *)packed);")
    ta, tb, tacc = TYPES[op.dtype]
    int8 = op.dtype == "int8"
    return "\n".join([
        preamble(d, constants, s.threads), "#include <stdint.h>\n#include <string.h>",
        (d.int8 if int8 else d.bf16) + d.tile_vocabulary(op.dtype) * tiles,
        f"typedef {ta} ta_t;\ntypedef {tb} tb_t;\ntypedef {tacc} tacc_t;\n" + _TYPES
        + _activation_types(op),
        "#define VCVTI(p) tc_cvt_i32(p)\n" + _CVT if int8 else "#define VCVTI(p) VLOAD(p)\n",
        scalar_helpers(op.epilogue), _PACK_W,
        "" if in_place else _pack_x(op, d.lanes, pixc), _finish(op, d), _store_block(op, d) if tiles else "",
        (tile_plane if plane else tile_row)(s.ow_block // TILE_ROWS, s.oc_block // TILE_ROWS)
        if tiles else _row(s.oc_block // d.lanes, s.ow_block),
        kernel_entries(op, lambda once: _body(once, _tile_config(op, s, pixc), in_place),
                       threads=s.threads, rename={"W": "Wt"},
                       optional=("qa", "scale", "add", "aq", CHANNEL_OPERAND),
                       ws_floats="((XQ_BYTES + WQ_ITEMS * (long)sizeof(ib_t) + 3) / 4)",
                       packed=packed, packed_ws_floats="((XQ_BYTES + 3) / 4)"),
    ])


def _shape(op: OpSignature, tiles: bool) -> dict[str, int | str]:
    """The kernel's shape constants, and X's as it lies (``XH``, ``XW``, ``XSH``, ``XSW``:
    where the packing reads pixel (h, w)). A strided 1x1 on tiles (``subsamples``) packs
    the pixels it reads into a dense plane and convolves that with stride 1: H, W are P, Q."""
    shape = shape_constants(op)
    d = op.dims_dict
    shape.update(XH=d["H"], XW=d["W"], XSH=1, XSW=1)
    if tiles and subsamples(op):
        shape.update(H=op.out_h, W=op.out_w, HP=op.out_h, WP=op.out_w, SH=1, SW=1,
                     XSH=d["stride_h"], XSW=d["stride_w"])
    return shape


def _activation_types(op: OpSignature) -> str:
    """C types of X, Y and the residual (``tx_t``, ``ty_t``, ``tadd_t``: float, or uint8 or
    bfloat16 where ``op`` holds them narrow), and Y's stores: ``TY(u)`` one value,
    ``TY_STORE(p, v)`` a vector (a uint8 Y's values are whole numbers in 0..255 by then)."""
    held = narrow_tensors(op)
    narrow = {"uint8": "uint8_t", "bfloat16": "uint16_t"}[narrow_type(op)]
    kinds = {t: narrow if t in held else "float" for t in ("x", "add")}
    return (BF16_SCALAR * (op.dtype == "bf16")
            + f"typedef {kinds['x']} tx_t;\ntypedef {kinds['add']} tadd_t;\n" + y_storage(op))


_CVT = """\
/* LANES int32 accumulators as a float vector. */
static inline vec tc_cvt_i32(const int32_t *p) {
  float f[LANES] __attribute__((aligned(64)));
  for (int i = 0; i < LANES; i++) f[i] = (float)p[i];
  return VLOAD(f);
}
"""
