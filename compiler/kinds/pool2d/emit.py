"""The C emitter of pool2d: one translation unit per op and validated schedule.

Kernels (C, every ISA of :mod:`tunecache.compiler.codegen.isa`): each output row is made in
two vectorised passes over a small row buffer of its thread: a *vertical* pass reduces the
window's valid input rows column by column (contiguous loads, ``vec`` vectors per step) into
the buffer, whose edges hold the padding value; a *horizontal* pass reduces ``S`` taps of the
buffer for ``ow_block`` output columns at a time (unaligned loads for ``stride_w=1``, a
stride-2 de-interleaving load for 2, gathered lanes above), scales averages by the separable
reciprocal window sizes and stores the row (its last tile spills whole vectors into the next
row, rewritten later, except at the end of a thread's range). Rows go in blocks of ``rows``:
the vertical passes of a block before its horizontal passes, because loading a row buffer at
unaligned offsets right after storing it stalls on store forwarding (blocks of four rows ran
about twice as fast on 35x35 planes). The input is read once from memory (the vertical pass
re-reads the few rows windows share from cache) and the output written once. Global pooling
(``R=H, S=W``, no padding, no dilation) reduces each contiguous plane directly. Threads split
the ``N*C*P`` output rows (the planes, for global pooling).

Blocked layout (``layout=nchw{x}c``, X and Y ``[N][ceil(C/x)][H][W][x]``, see
:mod:`tunecache.compiler.kinds.layouts`): a pixel's ``x`` channels are ``x/lanes`` vectors and
the window reduces whole pixels, so no row buffer and no horizontal shuffles are needed.
Threads split the output rows; each row's columns whose windows lie inside the input run
without bounds checks (``vec`` output pixels per step, the window-width loop unrolled by
``unroll``), the border columns check each tap; averages divide by the window's counted
taps. Global pooling reduces a plane's pixels ``vec`` at a time. ``ow_block`` (one vector),
``rows=1`` and ``nt=0`` do not apply.
"""

from __future__ import annotations

from tunecache.compiler.codegen.abi import HEADER, TIMER, WORKSPACE, parallel_entry
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.kinds.layouts import channel_block
from tunecache.compiler.kinds.pool2d.space import (
    ALIGN,
    Pool2dSchedule,
    is_blocked,
    is_global,
    row_buffer,
    workspace_floats,
)
from tunecache.compiler.mathutil import round_up
from tunecache.compiler.ops import OpSignature


def _constants(op: OpSignature, lanes: int) -> str:
    d = op.dims_dict
    values = {
        "NPLANES": d["N"] * d["C"], "IH": d["H"], "IW": d["W"], "OH": op.out_h, "OW": op.out_w,
        "KH": d["R"], "KW": d["S"], "SH": d["stride_h"], "SW": d["stride_w"],
        "PT": d["pad_t"], "PB": d["pad_b"], "PL": d["pad_l"], "PR": d["pad_r"],
        "DH": d["dil_h"], "DW": d["dil_w"], "LANES": lanes,
    }
    return "".join(f"#define {k} {v}L\n" for k, v in values.items())


def _reduce_op(op: OpSignature) -> str:
    return "VADD" if op.attr("mode") == "avg" else "VMAXN"  # a NaN in a window wins it


def _finish(op: OpSignature, v: str) -> list[str]:
    return [f"{v} = VRELU({v});"] if "relu" in op.epilogue else []


def _emit_global(op: OpSignature, s: Pool2dSchedule, d: IsaDialect) -> str:
    """Each plane of ``IH*IW`` contiguous floats reduced to one output."""
    red = _reduce_op(op)
    avg = op.attr("mode") == "avg"
    nv = s.vec
    fill = "0.0f" if avg else "-__builtin_inff()"
    accs = [f"a{v}" for v in range(nv)]
    init = " ".join(f"vec a{v} = VSET1({fill});" for v in range(nv))
    step = "\n".join(f"      a{v} = {red}(a{v}, VLOADU(x + i + {v} * LANES));" for v in range(nv))
    combine = "".join(f"  a0 = {red}(a0, {a});\n" for a in accs[1:])
    scalar = "VHSUM(a0) * (1.0f / (float)PLANE)" if avg else "VHMAXN(a0)"
    relu = " if (r < 0.0f) r = 0.0f;" if "relu" in op.epilogue else ""
    body = f"""\
#define PLANE (IH * IW)
static inline float reduce_plane(const float *x) {{
  {init}
  long i = 0;
  #pragma GCC unroll {s.unroll}
  for (; i + {nv} * LANES <= PLANE; i += {nv} * LANES) {{
{step}
  }}
  for (; i + LANES <= PLANE; i += LANES) a0 = {red}(a0, VLOADU(x + i));
  if (i < PLANE) a0 = {red}(a0, VFILL_PART(VLOADU_PART(x + i, (int)(PLANE - i)), (int)(PLANE - i), {fill}));
{combine}  return {scalar};
}}

static void pool_part(const float *X, float *Y, int tid, int nth) {{
  long lo, hi;
  split_range(NPLANES, tid, nth, &lo, &hi);
  for (long c = lo; c < hi; c++) {{
    float r = reduce_plane(X + c * PLANE);{relu}
    Y[c] = r;
  }}
}}
"""
    return body


def _load(stride_w: int) -> str:
    if stride_w == 1:
        return "VLOADU"
    if stride_w == 2:
        return "VLOADS2"
    return "load_strided"


_STRIDED_LOAD = """\
static inline vec load_strided(const float *p) {
  float t[LANES];
  for (int i = 0; i < LANES; i++) t[i] = p[i * SW];
  return VLOADU(t);
}
"""

# nt: output rows go through a per-thread stage that lines up with the cache lines of Y;
# whole lines leave it by streaming stores, back to back (a line half written by streaming
# stores and finished much later costs a partial-line write to memory), the first partial
# line of a thread's range and its last by plain stores.
_STAGE = """\
#define LINE 16L
static inline void stage_flush(float *Y, float *stage, long *base, long *fill, long *skip) {
  const long lines = *fill / LINE;
  for (long v = 0; v < lines; v++) {
    if (v == 0 && *skip) {
      for (long l = *skip; l < LINE; l++) Y[*base + l] = stage[l];
      *skip = 0;
      continue;
    }
    for (long l = 0; l < LINE; l += LANES)
      VSTREAM(Y + *base + v * LINE + l, VLOAD(stage + v * LINE + l));
  }
  if (lines) {
    for (long l = 0; l < LINE; l += LANES) VSTOREU(stage + l, VLOADU(stage + lines * LINE + l));
    *base += lines * LINE;
    *fill -= lines * LINE;
  }
}
"""

_COUNT = """\
/* Taps of output o's window along one axis that an average divides by. */
static float window_taps(long o, long size, long k, long stride, long lo, long hi, long dil) {
  long n = 0;
  for (long t = 0; t < k; t++) {
    long pos = o * stride - lo + t * dil;
    n += INCLUDE_PAD ? (pos >= -lo && pos < size + hi) : (pos >= 0 && pos < size);
  }
  return (float)n;
}
"""


def _emit_vertical(op: OpSignature, s: Pool2dSchedule) -> str:
    """Reduce the ``nr`` valid window rows column by column into ``out[0..IW)``."""
    red = _reduce_op(op)
    nv = s.vec
    first = " ".join(f"vec a{v} = VLOADU(rows[0] + j + {v} * LANES);" for v in range(nv))
    more = "\n".join(f"        a{v} = {red}(a{v}, VLOADU(rows[k] + j + {v} * LANES));"
                     for v in range(nv))
    store = " ".join(f"VSTOREU(out + j + {v} * LANES, a{v});" for v in range(nv))
    return f"""\
static inline void vertical(const float *const *rows, int nr, float *out) {{
  long j = 0;
  for (; j + {nv} * LANES <= IW; j += {nv} * LANES) {{
    {first}
    #pragma GCC unroll {s.unroll}
    for (int k = 1; k < nr; k++) {{
{more}
    }}
    {store}
  }}
  for (; j + LANES <= IW; j += LANES) {{
    vec a = VLOADU(rows[0] + j);
    for (int k = 1; k < nr; k++) a = {red}(a, VLOADU(rows[k] + j));
    VSTOREU(out + j, a);
  }}
  if (j < IW) {{
    const int n = (int)(IW - j);
    vec a = VLOADU_PART(rows[0] + j, n);
    for (int k = 1; k < nr; k++) a = {red}(a, VLOADU_PART(rows[k] + j, n));
    VSTOREU(out + j, VFILL_PART(a, n, PAD_VALUE)); /* the buffer has room; padding stays */
  }}
}}
"""


def _emit_horizontal(op: OpSignature, s: Pool2dSchedule, lanes: int) -> str:
    """``KW`` taps of the row buffer for ``ow_block`` output columns at a time."""
    red = _reduce_op(op)
    avg = op.attr("mode") == "avg"
    nv = s.ow_block // lanes
    load = _load(op.dim("stride_w"))
    tile = ["const float *b = base + q0 * SW;"]
    tile += [f"vec a{v} = {load}(b + {v * lanes} * SW);" for v in range(nv)]
    tile += [f"#pragma GCC unroll {s.unroll}", "for (long t = 1; t < KW; t++) {",
             "  const float *c = b + t * DW;"]
    tile += [f"  a{v} = {red}(a{v}, {load}(c + {v * lanes} * SW));" for v in range(nv)]
    tile.append("}")
    for v in range(nv):
        if avg:
            tile.append(f"a{v} = VMUL(VMUL(a{v}, row_scale), VLOADU(inv_w + q0 + {v * lanes}));")
        tile += _finish(op, f"a{v}")
    full = [f"VSTOREU(y + q0 + {v * lanes}, a{v});" for v in range(nv)]
    part = [f"if (n > {v * lanes}) VSTOREU_PART(y + q0 + {v * lanes}, a{v}, "
            f"n - {v * lanes} < LANES ? (int)(n - {v * lanes}) : (int)LANES);" for v in range(nv)]
    body = "\n".join("    " + line for line in tile)
    return f"""\
/* spill: the last tile may write whole vectors past the row (rows written later, or stage
   slack, take them); else partial stores end it exactly. */
static inline void horizontal(const float *base, float *y, int spill, const float *inv_w,
                              vec row_scale) {{
  (void)inv_w; (void)row_scale;
  long q0 = 0;
  for (; q0 + {s.ow_block} <= OW; q0 += {s.ow_block}) {{
{body}
    {" ".join(full)}
  }}
  if (q0 < OW) {{
    const long n = OW - q0;
{body}
    if (spill) {{ {" ".join(full)} }}
    else {{ {" ".join(part)} }}
  }}
}}
"""


def _emit_windowed(op: OpSignature, s: Pool2dSchedule, d: IsaDialect) -> str:
    avg = op.attr("mode") == "avg"
    origin, floats, tiles = row_buffer(op, s, d.lanes)
    fill = "0.0f" if avg else "-__builtin_inff()"
    parts = [
        f"#define INCLUDE_PAD {op.dim('count_include_pad')}\n#define PAD_VALUE {fill}\n"
        f"#define VB_ORIGIN {origin}L\n#define VB_FLOATS {floats}L\n#define QTILES {tiles}L\n"
        f"#define ROWS {s.rows}L\n#define WS_THREAD {workspace_floats(op, s, d.lanes)}L\n",
        _COUNT,
    ]
    if op.dim("stride_w") > 2:
        parts.append(_STRIDED_LOAD)
    parts += [_emit_vertical(op, s), _emit_horizontal(op, s, d.lanes)]
    scale = ("VSET1(1.0f / window_taps(p, IH, KH, SH, PT, PB, DH))" if avg else "VZERO()")
    inv_w = ("  for (long q = 0; q < QTILES; q++)\n"
             "    inv_w[q] = q < OW ? 1.0f / window_taps(q, IW, KW, SW, PL, PR, DW) : 0.0f;\n"
             if avg else "")
    if s.nt:
        parts.append(_STAGE)
        setup = (f"  float *stage = inv_w + {round_up(tiles, ALIGN)}L;\n"
                 "  const long mis = (long)(((unsigned long)Y / 4) & (LINE - 1));\n"
                 "  long base = ((lo * OW + mis) & ~(LINE - 1)) - mis, fill = lo * OW - base;\n"
                 "  long skip = fill;\n")
        # Lines written by the previous block leave before this block's rows are appended.
        flush = "    stage_flush(Y, stage, &base, &fill, &skip);\n"
        target = "stage + fill, 1"
        after = "      fill += OW;\n"
        finish = ("  stage_flush(Y, stage, &base, &fill, &skip);\n"
                  "  for (long l = skip; l < fill; l++) Y[base + l] = stage[l];\n"
                  "  VSFENCE();\n")
    else:
        # Rows are written in order, so a tile spilling into this thread's later rows is
        # overwritten in time.
        setup, flush, after, finish = "", "", "", ""
        target = f"Y + item * OW, (item + 1) * OW + {s.ow_block} <= hi * OW"
    parts.append(f"""\
/* The valid input rows of output row p's windows. */
static inline int window_rows(const float *x, long p, const float **rows) {{
  int nr = 0;
  for (long r = 0; r < KH; r++) {{
    const long h = p * SH - PT + r * DH;
    if (h >= 0 && h < IH) rows[nr++] = x + h * IW;
  }}
  return nr;
}}

/* ROWS output rows per block: their vertical passes first, so the row buffers' stores have
   left the store buffer when the horizontal passes load them at unaligned offsets. */
static void pool_part(const float *X, float *Y, float *ws, int tid, int nth) {{
  long lo, hi;
  split_range(NPLANES * OH, tid, nth, &lo, &hi);
  if (lo >= hi) return;
  float *vb = ws + tid * WS_THREAD, *inv_w = vb + ROWS * VB_FLOATS;
  for (long i = 0; i < ROWS * VB_FLOATS; i++) vb[i] = PAD_VALUE;
{inv_w}{setup}  for (long block = lo; block < hi; block += ROWS) {{
    const long n = MIN(ROWS, hi - block);
    for (long k = 0; k < n; k++) {{
      const long item = block + k, plane = item / OH, p = item % OH;
      const float *rows[KH];
      const int nr = window_rows(X + plane * (IH * IW), p, rows);
      vertical(rows, nr, vb + k * VB_FLOATS + VB_ORIGIN);
    }}
{flush}    for (long k = 0; k < n; k++) {{
      const long item = block + k, p = item % OH;
      (void)p;
      horizontal(vb + k * VB_FLOATS + VB_ORIGIN - PL, {target}, inv_w, {scale});
{after}    }}
  }}
{finish}}}
""")
    return "\n".join(parts)


# -- blocked layout -------------------------------------------------------------------------


def _interior_columns(op: OpSignature) -> tuple[int, int]:
    """Output columns ``[first, end)`` whose windows lie inside the input's width."""
    d = op.dims_dict
    q = op.out_w
    first = min(q, -(-d["pad_l"] // d["stride_w"]))
    last_start = d["W"] - 1 - (d["S"] - 1) * d["dil_w"] + d["pad_l"]
    end = last_start // d["stride_w"] + 1 if last_start >= 0 else 0
    return first, max(first, min(end, q))


def _pixel_accumulators(op: OpSignature, pixels: int, nvb: int) -> list[str]:
    fill = "VZERO()" if op.attr("mode") == "avg" else "VSET1(-__builtin_inff())"
    return [f"  vec {', '.join(f'a{v}_{k} = {fill}' for k in range(nvb))};"
            for v in range(pixels)]


def _pixel_stores(op: OpSignature, pixels: int, nvb: int, scale: str) -> list[str]:
    """Store ``pixels`` consecutive output pixels at ``y + q * XB``; ``scale`` (a float
    expression of ``v``, the pixel) multiplies averages."""
    avg = op.attr("mode") == "avg"
    lines = []
    for v in range(pixels):
        if avg:
            lines.append(f"  {{ const vec sc = VSET1({scale.format(v=v)});")
        for k in range(nvb):
            steps = ["vec t = " + (f"VMUL(a{v}_{k}, sc);" if avg else f"a{v}_{k};")]
            steps += _finish(op, "t")
            lines.append(f"    {{ {' '.join(steps)} YSTORE(y + (q + {v}) * XB + {k} * LANES, t); }}")
        if avg:
            lines.append("  }")
    return lines


def _emit_blocked_windowed(op: OpSignature, s: Pool2dSchedule, nvb: int) -> str:
    red = _reduce_op(op)
    avg = op.attr("mode") == "avg"
    first, end = _interior_columns(op)
    parts = [f"#define Q0 {first}L\n#define Q1 {end}L\n"]
    if avg:
        parts.append(_COUNT)
    border = [
        "/* Output pixel q of the row at input row h0: taps inside the input only. */",
        "static inline void border_pixel(const x_t *x, y_t *y, long h0, long q, "
        "float scale) {",
        "  (void)scale;",
        *_pixel_accumulators(op, 1, nvb),
        "  for (long r = 0; r < KH; r++) {",
        "    const long h = h0 + r * DH;",
        "    if (h < 0 || h >= IH) continue;",
        "    for (long s = 0; s < KW; s++) {",
        "      const long w = q * SW - PL + s * DW;",
        "      if (w < 0 || w >= IW) continue;",
        "      const x_t *xp = x + (h * IW + w) * XB;",
        *(f"      a0_{k} = {red}(a0_{k}, XLOAD(xp + {k} * LANES));" for k in range(nvb)),
        "    }",
        "  }",
        *_pixel_stores(op, 1, nvb, "scale"),
        "}",
    ]
    parts.append("\n".join(border))
    for pixels in dict.fromkeys((s.vec, 1)):
        taps = [f"      a{v}_{k} = {red}(a{v}_{k}, XLOAD(xs + {v * op.dim('stride_w')} * XB "
                f"+ {k} * LANES));" for v in range(pixels) for k in range(nvb)]
        parts.append("\n".join([
            f"/* Output pixels q..q+{pixels - 1} of the row at input row h0, their windows "
            "inside the input's width. */",
            f"static inline void interior_{pixels}(const x_t *x, y_t *y, long h0, long q, "
            "const float *inv_w, float rscale) {",
            "  (void)inv_w; (void)rscale;",
            *_pixel_accumulators(op, pixels, nvb),
            "  const x_t *xq = x + (q * SW - PL) * XB;",
            "  for (long r = 0; r < KH; r++) {",
            "    const long h = h0 + r * DH;",
            "    if (h < 0 || h >= IH) continue;",
            "    const x_t *xr = xq + h * IW * XB;",
            f"    #pragma GCC unroll {s.unroll}",
            "    for (long s = 0; s < KW; s++) {",
            "      const x_t *xs = xr + s * DW * XB;",
            *taps,
            "    }",
            "  }",
            *_pixel_stores(op, pixels, nvb, "rscale * inv_w[q + {v}]"),
            "}",
        ]))
    setup = ("  float *inv_w = ws + tid * WS_THREAD;\n"
             "  for (long q = 0; q < OW; q++) inv_w[q] = 1.0f / window_taps(q, IW, KW, SW, PL, "
             "PR, DW);\n" if avg else "  const float *inv_w = NULL;\n  (void)ws;\n")
    rscale = "1.0f / window_taps(p, IH, KH, SH, PT, PB, DH)" if avg else "1.0f"
    col = "rscale * inv_w[q]" if avg else "1.0f"
    parts.append(f"""\
static void pool_part(const x_t *X, y_t *Y, float *ws, int tid, int nth) {{
  long lo, hi;
  split_range(NBLK * OH, tid, nth, &lo, &hi);
  if (lo >= hi) return;
{setup}  for (long item = lo; item < hi; item++) {{
    const long p = item % OH;
    const x_t *x = X + item / OH * (IH * IW * XB);
    y_t *y = Y + item * (OW * XB);
    const long h0 = p * SH - PT;
    const float rscale = {rscale};
    (void)rscale;
    long q = 0;
    for (; q < Q0; q++) border_pixel(x, y, h0, q, {col});
    for (; q + {s.vec} <= Q1; q += {s.vec}) interior_{s.vec}(x, y, h0, q, inv_w, rscale);
    for (; q < Q1; q++) interior_1(x, y, h0, q, inv_w, rscale);
    for (; q < OW; q++) border_pixel(x, y, h0, q, {col});
  }}
}}
""")
    return "\n".join(parts)


def _emit_blocked_global(op: OpSignature, s: Pool2dSchedule, nvb: int) -> str:
    red = _reduce_op(op)
    nv = s.vec
    taps = "\n".join(f"      a{v}_{k} = {red}(a{v}_{k}, XLOAD(x + (i + {v}) * XB + {k} * LANES));"
                     for v in range(nv) for k in range(nvb))
    rest = "\n".join(f"      a0_{k} = {red}(a0_{k}, XLOAD(x + i * XB + {k} * LANES));"
                     for k in range(nvb))
    combine = "\n".join(f"    a0_{k} = {red}(a0_{k}, a{v}_{k});"
                        for v in range(1, nv) for k in range(nvb))
    stores = "\n".join(_pixel_stores(op, 1, nvb, "1.0f / (float)(IH * IW)"))
    return f"""\
static void pool_part(const x_t *X, y_t *Y, float *ws, int tid, int nth) {{
  (void)ws;
  long lo, hi;
  split_range(NBLK, tid, nth, &lo, &hi);
  for (long b = lo; b < hi; b++) {{
    const x_t *x = X + b * (IH * IW * XB);
    y_t *y = Y + b * XB;
    const long q = 0;
{chr(10).join("  " + line for line in _pixel_accumulators(op, nv, nvb))}
    long i = 0;
    #pragma GCC unroll {s.unroll}
    for (; i + {nv} <= IH * IW; i += {nv}) {{
{taps}
    }}
    for (; i < IH * IW; i++) {{
{rest}
    }}
{combine}
{chr(10).join("  " + line for line in stores.splitlines())}
  }}
}}
"""


def _element_types(op: OpSignature) -> str:
    """``x_t``/``XLOAD`` and ``y_t``/``YSTORE``: float32, or bfloat16 (uint8 for an int8
    op) where ``op`` holds the tensor narrow."""
    held = dict(op.attrs).get("narrow", "none").split("+")
    u8 = op.dtype == "int8"  # a max of uint8 bytes: whole numbers in 0..255 throughout
    narrow_x = ("uint8_t", "VLOAD_U8(p)") if u8 else ("uint16_t", "VLOAD_BF16(p)")
    narrow_y = ("uint8_t", "VSTORE_U8(p, v)") if u8 else ("uint16_t", "VSTORE_BF16(p, v)")
    x = narrow_x if "x" in held else ("float", "VLOADU(p)")
    y = narrow_y if "y" in held else ("float", "VSTOREU(p, v)")
    return (f"#include <stdint.h>\ntypedef {x[0]} x_t;\n#define XLOAD(p) {x[1]}\n"
            f"typedef {y[0]} y_t;\n#define YSTORE(p, v) {y[1]}\n")


def _emit_blocked(op: OpSignature, s: Pool2dSchedule, d: IsaDialect) -> str:
    """Pooling of blocked tensors: each output pixel's ``x`` channels are ``x/lanes``
    vectors reduced over its window's pixels."""
    x = channel_block(op.attr("layout"))
    nvb = x // d.lanes
    avg = op.attr("mode") == "avg"
    ws = round_up(op.out_w, ALIGN) if avg and not is_global(op) else 0
    head = (f"#define XB {x}L\n#define NBLK {op.dim('N') * -(-op.dim('C') // x)}L\n"
            f"#define INCLUDE_PAD {op.dim('count_include_pad')}\n#define WS_THREAD {ws}L\n"
            + _element_types(op))
    if is_global(op):
        return head + _emit_blocked_global(op, s, nvb)
    return head + _emit_blocked_windowed(op, s, nvb)


_PLAIN_BYTES = """\
#include <stdint.h>
/* An int8 max pool over uint8 planes, window by window: the planner blocks a pool between
   int8 convolutions, so this plain form only keeps a model whose pool stays NCHW running. */
static void pool_part(const uint8_t *X, uint8_t *Y, int tid, int nth) {
  long lo, hi;
  split_range(NPLANES * OH, tid, nth, &lo, &hi);
  for (long item = lo; item < hi; item++) {
    const long p = item % OH;
    const uint8_t *x = X + item / OH * (IH * IW);
    uint8_t *y = Y + item * OW;
    for (long q = 0; q < OW; q++) {
      int top = 0; /* every window has a tap inside the input, and bytes are >= 0 */
      for (long r = 0; r < KH; r++) {
        const long h = p * SH - PT + r * DH;
        if (h < 0 || h >= IH) continue;
        for (long t = 0; t < KW; t++) {
          const long w = q * SW - PL + t * DW;
          if (w >= 0 && w < IW && x[h * IW + w] > top) top = x[h * IW + w];
        }
      }
      y[q] = (uint8_t)top;
    }
  }
}
"""


def emit_pool2d(op: OpSignature, s: Pool2dSchedule, d: IsaDialect) -> str:
    """The C translation unit for the pool2d ``op`` under ``s`` (validated by the caller)."""
    out = [d.prelude, HEADER, _constants(op, d.lanes), WORKSPACE]
    if op.dtype == "int8" and not is_blocked(op):
        out.append(_PLAIN_BYTES)
        call, ws = "pool_part(X, Y, TID, NTH);", "0"
    elif is_blocked(op):
        out.append(_emit_blocked(op, s, d))
        call, ws = "pool_part(X, Y, ws, TID, NTH);", f"{s.threads} * WS_THREAD"
    elif is_global(op):
        out.append(_emit_global(op, s, d))
        call, ws = "pool_part(X, Y, TID, NTH);", "0"
    else:
        out.append(_emit_windowed(op, s, d))
        call, ws = "pool_part(X, Y, ws, TID, NTH);", f"{s.threads} * WS_THREAD"
    types = (("x_t", "y_t") if is_blocked(op) else ("uint8_t", "uint8_t")
             if op.dtype == "int8" else ("float", "float"))
    out.append("int tc_kernel(void **args) {\n"
               f"  const {types[0]} *X = (const {types[0]} *)args[0];\n"
               f"  {types[1]} *Y = ({types[1]} *)args[1];\n"
               + parallel_entry(s.threads, call, ws))
    out.append(TIMER)
    return "\n".join(out)
