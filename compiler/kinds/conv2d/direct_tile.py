"""The direct conv2d kernel's register tile and its way to Y.

:func:`direct_ukr` renders the micro-kernel (a tile of pixels x output-channel vectors over
the whole reduction, or one chunk of it), its tap loops (nested, or one loop over
:func:`tap_table`) and its store into the aligned scratch tile; :func:`store_tile_code` renders
``store_tile``, which moves the scratch tile to Y with the epilogue: transposed into NCHW,
vector by vector into a blocked Y (:func:`blocked_store`) or element by element (a grouped
convolution into a blocked Y). The fused pointwise-depthwise kernel reuses the micro-kernel
and the blocked store.
"""

from __future__ import annotations

from tunecache.compiler.codegen.epilogue import CHANNEL_OPERAND, chain_rows, render
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.codegen.microkernel import Loop, Store, Tile, micro_kernel
from tunecache.compiler.kinds.conv2d.direct_plan import DirectPlan
from tunecache.compiler.kinds.conv2d.epilogue import (
    epilogue_scalar,
    tile_epilogue,
    vector_tile_epilogue,
)
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule
from tunecache.compiler.ops import OpSignature


def tap_table(op: OpSignature) -> str:
    """``TAP_X``: each kernel tap's input offset, row-major over (r, s), for flat tap loops."""
    dims = op.dims_dict
    offsets = ", ".join(f"({r} * DH * WP + {c} * DW) * ICB"
                        for r in range(dims["R"]) for c in range(dims["S"]))
    return f"static const long TAP_X[R * S] = {{{offsets}}};"


def _tap_loops(flat: bool, unroll: int) -> list[Loop]:
    """The loops over a dense direct tile's kernel taps, setting ``xr`` and ``wr``."""
    if flat:
        return [Loop("for (long t = 0; t < R * S; t++)",
                     ("const float *xr = xc + TAP_X[t];",
                      "const float *wr = wc + t * (ICB * OCB);"), unroll)]
    return [Loop("for (long r = 0; r < R; r++)"),
            Loop("for (long s = 0; s < S; s++)",
                 ("const float *xr = xc + (r * DH * WP + s * DW) * ICB;",
                  "const float *wr = wc + (r * S + s) * (ICB * OCB);"), unroll)]


def direct_ukr(name: str, th: int, tw: int, s: Conv2dSchedule, d: IsaDialect,
                depthwise: bool, xi: int = 0, flat: bool = False,
                prefetch_next: bool = False, chunked: bool = False) -> str:
    """A register tile of ``th`` x ``tw`` pixels (rows) x OCB channels (vectors) over the whole
    reduction, stored to the aligned scratch ``tile`` for :func:`store_tile`'s epilogue.

    Dense: per input channel, OCB weights as vectors times each pixel's input broadcast.
    Depthwise: per tap, OCB weights times each pixel's OCB channels, both vectors (read from
    ``Xb``'s OCB-channel pixels, or with ``xi`` from a blocked input's ``xi``-channel pixels).
    ``flat``: one loop over the taps of ``TAP_X`` (:func:`direct_plan.flat_taps`) instead of rows and
    columns. ``prefetch_next``: each input-channel step prefetches the next channel block's
    weights (:func:`direct_plan.prefetch_next_weights`). ``chunked`` (dense): the tile reduces ``ncb``
    channel blocks and adds its sums to the scratch tile unless ``first``
    (:func:`direct_plan.chunk_blocks`).
    """
    pixels = [(i, j) for i in range(th) for j in range(tw)]
    tile = Tile(tuple(f"{i}_{j}" for i, j in pixels), s.oc_block // d.lanes, d.lanes)
    unroll = 16 if s.unroll_kw else 1
    if depthwise:
        pixel, load = ("XI", "VLOADU") if xi else ("OCB", "VLOAD")
        loops = [Loop("for (long r = 0; r < R; r++)"),
                 Loop("for (long s = 0; s < S; s++)",
                      (f"const float *xr = xb + (r * DH * WP + s * DW) * {pixel};",
                       "const float *wr = wb + (r * S + s) * OCB;"), unroll)]
        columns = "VLOAD(wr + {o})"
        rows = [f"{load}(xr + ({i} * SH * WP + {j} * SW) * {pixel} + {{o}})" for i, j in pixels]
    else:
        setup: tuple[str, ...] = ("const float *xc = xb + cb * XCB;",
                                  "const float *wc = wb + cb * (R * S * ICB * OCB);")
        if prefetch_next:
            setup += ("for (long l = 0; l < R * S * ICB * OCB; l += 16) "
                      "__builtin_prefetch(wc + NCB * R * S * ICB * OCB + l, 0, 1);",)
        blocks = "ncb" if chunked else "NCB"
        loops = [Loop(f"for (long cb = 0; cb < {blocks}; cb++)", setup),
                 *_tap_loops(flat, unroll),
                 Loop("for (long c = 0; c < ICB; c++)")]
        columns = "VLOAD(wr + c * OCB + {o})"
        rows = [f"xr[({i} * SH * WP + {j} * SW) * ICB + c]" for i, j in pixels]
    signature = (f"static inline void {name}(const float *restrict xb, const float *restrict wb, "
                 "float *restrict tile" + (", long ncb, int first)" if chunked else ")"))
    spec = Store(tuple(f"tile + ({i} * TW + {j}) * OCB" for i, j in pixels), aligned=True,
                 accumulate="!first" if chunked else "")
    return micro_kernel(signature, tile, loops, columns, rows, spec)


def blocked_store(op: OpSignature, s: Conv2dSchedule, lanes: int, xo: int) -> str:
    """``store_tile`` of the ``vector`` sink: the scratch tile into a blocked Y at ``y`` (the
    tile's first channel's lane at its first pixel) with the epilogue, vector by vector.
    Vector ``v`` of a pixel lies ``v * lanes`` channels on, in the next block every ``xo``
    channels; ``bp`` holds the tile's bias (zero beyond F), ``ad`` the residual at ``y``'s
    position; vectors from ``vmax`` on lie beyond Y's last block (tiles wider than a block).
    Storing from registers right after the reduction would keep the bias and relu's zero
    live across it, and a full register tile then spills accumulators."""
    block = op.out_h * op.out_w * xo
    lines = []
    for v in range(s.oc_block // lanes):
        off = f"(i * Q + j) * XO + {(v * lanes // xo) * block + v * lanes % xo}"
        epi = render(op.epilogue, "t", {"bias": f"VLOADU(bp + {v * lanes})",
                                        "add": f"VLOADU(ad + {off})",
                                        CHANNEL_OPERAND: f"VLOADU(cp + {{i}} * F + {v * lanes})"},
                     vector=True)
        put = (f"{{ vec t = VLOAD(tile + (i * TW + j) * OCB + {v * lanes}); "
               f"{epi + ' ' if epi else ''}TY_STORE(y + {off}, t); }}")
        guard = f"if ({v} < vmax) " if v and s.oc_block > xo else ""
        lines.append(f"      {guard}{put}")
    body = "\n".join(lines)
    chan_param = " const float *restrict cp," if chain_rows(op.epilogue) else ""
    return f"""\
static void store_tile(const float *restrict tile, ty_t *restrict y, const float *restrict bp,
                       const float *restrict ad,{chan_param} long th, long tw, long vmax) {{
  (void)bp; (void)ad; (void)vmax;
  for (long i = 0; i < th; i++)
    for (long j = 0; j < tw; j++) {{
{body}
    }}
}}
"""


def store_tile_code(op: OpSignature, s: Conv2dSchedule, lanes: int, plan: DirectPlan) -> str:
    """``store_tile``: output channel f0 + o, o < fvalid, of the th x tw tile at (p0, q0) of
    image n, from the scratch tile into Y (NCHW, or blocked for the ``scalar`` sink), with
    the epilogue; the ``scalar`` sink also gets ``zero_lanes`` for Y's padding lanes. The
    ``vector`` sink's is :func:`blocked_store`."""
    if plan.sink == "vector":
        return blocked_store(op, s, lanes, plan.xo)
    if plan.sink == "scalar":
        epi = epilogue_scalar(op, "v", "f", "o_off + j * XO")
        return f"""\
static void store_tile(const float *restrict tile, ty_t *restrict Y, const float *restrict bias,
                       const float *restrict add, const float *restrict chan, long n, long f0,
                       long fvalid, long p0, long q0, long th, long tw) {{
  (void)bias; (void)add; (void)chan;
  for (long o = 0; o < fvalid; o++) {{
    const long f = f0 + o;
    for (long i = 0; i < th; i++) {{
      const long o_off = ((n * CBY + f / XO) * P + p0 + i) * Q * XO + q0 * XO + f % XO;
      for (long j = 0; j < tw; j++) {{
        float v = tile[(i * TW + j) * OCB + o];
        {epi}
        Y[o_off + j * XO] = TY(v);
      }}
    }}
  }}
}}

/* Y's lanes beyond F (the last block's padding) are zero. Items: (n, pixel). */
static void zero_lanes(ty_t *restrict Y, long lo, long hi) {{
  for (long t = lo; t < hi; t++) {{
    ty_t *restrict y = Y + ((t / (P * Q) * CBY + CBY - 1) * P * Q + t % (P * Q)) * XO;
    for (long l = F - (CBY - 1) * XO; l < XO; l++) y[l] = TY(0.0f);
  }}
}}
"""
    # With a vector tile epilogue the tile arrives finished: this store only transposes.
    vector = vector_tile_epilogue(op)
    epi = "" if vector else epilogue_scalar(op, "v", "f", "o_off + j")
    return (tile_epilogue(op, s, lanes) if vector else "") + f"""\
static void store_tile(const float *restrict tile, ty_t *restrict Y, const float *restrict bias,
                       const float *restrict add, const float *restrict chan, long n, long f0,
                       long fvalid, long p0, long q0, long th, long tw) {{
  (void)bias; (void)add; (void)chan;
  for (long o = 0; o < fvalid; o++) {{
    const long f = f0 + o;
    for (long i = 0; i < th; i++) {{
      const long o_off = ((n * F + f) * P + p0 + i) * Q + q0;
      ty_t *restrict y = Y + o_off;
      for (long j = 0; j < tw; j++) {{
        float v = tile[(i * TW + j) * OCB + o];
        {epi}
        y[j] = TY(v);
      }}
    }}
  }}
}}
"""
