"""C code of the blocked direct conv2d kernel (``algorithm="direct"``, packed weights).

:func:`generate_direct` renders a :class:`DirectPlan`: the compile-time constants and the
workspace's layout, the operand copies (``direct_pack``), one micro-kernel per tile shape and
the stores (``direct_tile``), and ``conv_body``: each thread's tiles in the schedule's loop
order, reduced in one pass or chunk by chunk, with the band refreshes before them.
"""

from __future__ import annotations

import textwrap

from tunecache.compiler.codegen.abi import ALIGN_FLOATS, preamble
from tunecache.compiler.codegen.epilogue import chain_rows, scalar_helpers
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.kinds.conv2d.common import (
    bf16_scalar,
    conv2d_entries,
    shape_constants,
    x_storage,
    y_storage,
)
from tunecache.compiler.kinds.conv2d.direct_pack import BAND_REFRESH, DENSE_BAND_REFRESH, pack_code
from tunecache.compiler.kinds.conv2d.direct_plan import (
    DirectPlan,
    band_floats,
    band_rows,
    band_tiles,
    direct_plan,
    flat_taps,
    prefetch_next_weights,
    reduction_chunk,
    span_tiles,
)
from tunecache.compiler.kinds.conv2d.direct_tile import direct_ukr, store_tile_code, tap_table
from tunecache.compiler.kinds.conv2d.epilogue import vector_tile_epilogue
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule
from tunecache.compiler.mathutil import ceil_div, round_up
from tunecache.compiler.ops import OpSignature


def _tile_addresses(plan: DirectPlan) -> tuple[str, str, str, str]:
    """C expressions of a tile's input and weights, its first output channel and how many
    of its channels are real (``gf`` is the tile's channel block, ``n`` the image)."""
    if plan.depthwise:
        if plan.source == "band":
            x_at = "band + ((p0 - band_p0) * SH * WP + q0 * SW) * XI + (gf * OCB) % XI"
        elif plan.xi:
            x_at = ("Xb + ((n * CBX + (gf * OCB) / XI) * HP + p0 * SH) * WP * XI "
                    "+ q0 * SW * XI + (gf * OCB) % XI")
        else:
            x_at = "Xb + ((n * NCB + gf) * HP + p0 * SH) * WP * OCB + q0 * SW * OCB"
        return x_at, "Wb + gf * (R * S * OCB)", "gf * OCB", "MIN(OCB, C - gf * OCB)"
    if plan.source == "band":
        x_at = "band + q0 * SW * ICB"  # the band starts at the row tile's first input row
    else:
        x_at = "Xb + (((n * G + gf / NFB) * NCB) * HP + p0 * SH) * WP * ICB + q0 * SW * ICB"
    return (x_at, "Wb + gf * (NCB * R * S * ICB * OCB)", "(gf / NFB) * FG + (gf % NFB) * OCB",
            "MIN(OCB, FG - (gf % NFB) * OCB)")


def _tile_nest(s: Conv2dSchedule, x_at: str, w_at: str, dispatch: str, after: str, band: str,
               kcb: int) -> str:
    """The loops over this thread's tiles (``fp``: channel blocks outside pixel rows, ``pf``
    inside), each tile's micro-kernel then its store. Chunked (``kcb`` channel blocks a
    chunk): per chunk, every tile of the span (``fp``: the channel block's pixels, ``pf``: a
    pixel row's) adds its partial sums into its own scratch tile of ``part``; then the span's
    tiles are stored."""
    row_loop = ("for (long pb = pb_lo; pb < pb_hi; pb++) {",
                "const long p0 = pb * TH, th = MIN(TH, P - p0);")
    column_loop = ("for (long qt = qt_lo; qt < qt_hi; qt++) {",
                   "const long q0 = qt * TW, tw = MIN(TW, Q - q0);")
    gf_loop: tuple[str, ...] = ("for (long gf = gf_lo; gf < gf_hi; gf++) {",)
    outer: tuple[str, ...]
    span: list[tuple[str, ...]]
    # The band (depthwise, never chunked) is refreshed once both gf and the row are known.
    if s.loop_order == "fp":
        outer, span = gf_loop, [(*row_loop, band)]
    else:
        outer, span = (*row_loop, *gf_loop, band), []
    if not kcb:
        body = ("const float *xb = " + x_at + ";", "const float *wb = " + w_at + ";",
                dispatch, after)
        return _nest(("for (long n = 0; n < NB; n++) {", *outer), [*span, column_loop], body)
    slot = ("float *tile = part + ((pb - pb_lo) * NQT + qt - qt_lo) * TILE_FLOATS;"
            if s.loop_order == "fp" else "float *tile = part + (qt - qt_lo) * TILE_FLOATS;")
    chunk = ("for (long c0 = 0; c0 < NCB; c0 += KCB) {", "const long ncb = MIN(KCB, NCB - c0);")
    reduce_body = (slot, f"const float *xb = {x_at} + c0 * XCB;",
                   f"const float *wb = {w_at} + c0 * (R * S * ICB * OCB);",
                   _next_chunk_prefetch(s), dispatch)
    stores = _nest((), [*span, column_loop], (slot, after))
    reduce = _nest((), [chunk, *span, column_loop], reduce_body)
    return _nest(("for (long n = 0; n < NB; n++) {", *outer), [], (reduce, stores))


PREFETCH_NEXT_CHUNK = True
"""Off, chunked tiles do not prefetch the next chunk's weights (the switch an A/B flips)."""


def _next_chunk_prefetch(s: Conv2dSchedule) -> str:
    """C that prefetches this tile's share of the next chunk's weights into L2: the span's
    tiles split the chunk's cache lines between them, so each line is asked for once, while
    the current chunk is being reduced. The next chunk in memory is the same channel block's
    next chunk or, after the last, the next block's first: both are read next."""
    if not PREFETCH_NEXT_CHUNK:
        return ""
    index, count = (("(pb - pb_lo) * (qt_hi - qt_lo) + qt - qt_lo",
                     "(pb_hi - pb_lo) * (qt_hi - qt_lo)") if s.loop_order == "fp"
                    else ("qt - qt_lo", "qt_hi - qt_lo"))
    return f"""{{
  const long lines = KCB * R * S * ICB * OCB / 16, per = (lines + {count} - 1) / ({count});
  const long l0 = ({index}) * per, l1 = MIN(l0 + per, lines);
  const float *next = wb + ncb * (R * S * ICB * OCB);
  for (long l = l0; l < l1; l++) __builtin_prefetch(next + l * 16, 0, 2);
}}"""


def _nest(head: tuple[str, ...], loops: list[tuple[str, ...]], body: tuple[str, ...]) -> str:
    """C text of ``head`` (a loop header and its statements, or nothing) around ``loops``
    (each a header and its statements) around ``body``, braces closed."""
    levels = ([head] if head else []) + loops
    lines: list[str] = []
    depth = 1
    for level in levels:
        for line in filter(None, level):
            lines += ["  " * depth + part for part in textwrap.dedent(line).strip("\n").split("\n")]
            depth += line.endswith("{")
    for text in filter(None, body):
        lines += ["  " * depth + line for line in textwrap.dedent(text).strip("\n").split("\n")]
    while depth > 1:
        depth -= 1
        lines.append("  " * depth + "}")
    return "\n".join(lines)


def _conv_body(op: OpSignature, s: Conv2dSchedule, d: IsaDialect, plan: DirectPlan,
               variants: dict[tuple[int, int], str], kcb: int = 0) -> str:
    """``conv_body``: pack (input and, unless pre-packed, weights), a barrier, then every
    tile of this thread's share (:func:`_tile_nest`): its micro-kernel, then its store."""
    x_at, w_at, f0, fvalid = _tile_addresses(plan)
    vector = plan.sink == "vector"
    args = "xb, wb, tile, ncb, c0 == 0" if kcb else "xb, wb, tile"
    calls = [f"if (th == {vh} && tw == {vw}) {name}({args});"
             for (vh, vw), name in variants.items()]
    dispatch = "\nelse ".join(calls)
    split_oc = s.parallel == "oc"
    oc_range = ("long gf_lo, gf_hi; split_range(NGF, tid, nth, &gf_lo, &gf_hi);" if split_oc
                else "const long gf_lo = 0, gf_hi = NGF;")
    # One row block (a flat grid): a split by pixels splits its tiles instead.
    split_q = not split_oc and ceil_div(op.out_h, plan.th) == 1
    pb_range = ("const long pb_lo = 0, pb_hi = NPB;" if split_oc or split_q
                else "long pb_lo, pb_hi; split_range(NPB, tid, nth, &pb_lo, &pb_hi);")
    qt_range = ("long qt_lo, qt_hi; split_range(NQT, tid, nth, &qt_lo, &qt_hi);" if split_q
                else "const long qt_lo = 0, qt_hi = NQT;")
    band = ""
    if plan.source == "view":
        head = "  const float *Xb = X; float *Wb_ws = ws + OFF_WB;\n"
        pack = ""
    elif plan.source == "band":
        head = ("  float *band = ws + tid * BAND_FLOATS, *Wb_ws = ws + OFF_WB;\n"
                "  long band_nb = -1, band_p0 = -1;\n")
        pack = ""
        band = BAND_REFRESH if plan.depthwise else DENSE_BAND_REFRESH
    else:
        head = "  float *Xb = ws, *Wb_ws = ws + OFF_WB;\n"
        pack = ("  { long lo, hi; split_range(PACK_ITEMS, tid, nth, &lo, &hi); "
                "pack_input(X, Xb, lo, hi, xq); }\n")
    head += "  const float *Wb = packed ? Wt : Wb_ws;\n"
    if kcb:
        head += "  float *part = ws + OFF_PART + tid * PART_STRIDE;\n"
    else:
        head += f"  float tile[{plan.th * plan.tw * s.oc_block}] __attribute__((aligned(64)));\n"
    if vector:
        if plan.bias_floats:
            # Each thread its own copy: a shared one would need a barrier before any tile.
            head += "  float *Bp = ws + OFF_BP + tid * BP_STRIDE;\n"
            head += "  for (long f = 0; f < BP_FLOATS; f++) Bp[f] = f < F ? bias[f] : 0.0f;\n"
        bp = "Bp + f0" if plan.bias_floats else "NULL"
        cp = " chan + f0," if chain_rows(op.epilogue) else ""
        nv = s.oc_block // d.lanes
        vmax = f"MIN({nv}, (CBY * XO - f0) / {d.lanes})" if s.oc_block > plan.xo else str(nv)
        after = f"""
        const long f0 = {f0};
        ty_t *yp = Y + ((n * CBY + f0 / XO) * P + p0) * Q * XO + q0 * XO + f0 % XO;
        store_tile(tile, yp, {bp}, add ? add + (yp - Y) : NULL,{cp} th, tw, {vmax});"""
    elif plan.sink == "nchw" and vector_tile_epilogue(op):
        after = (f"\n        tile_epilogue(tile, bias, chan, {f0}, {fvalid});"
                 f"\n        store_tile(tile, Y, bias, add, chan, n, {f0}, {fvalid}, p0, q0, th,"
                 " tw);")
    else:
        after = (f"\n        store_tile(tile, Y, bias, add, chan, n, {f0}, {fvalid}, p0, q0, th,"
                 " tw);")
    # Threads wait for each other only for what they packed together.
    barrier = "BARRIER();" if pack else "if (!packed) { BARRIER(); }"
    tail = ""
    if plan.sink == "scalar" and op.dim("F") % plan.xo:
        tail = ("  { long lo, hi; split_range(NB * P * Q, tid, nth, &lo, &hi); "
                "zero_lanes(Y, lo, hi); }\n")
    return f"""\
static void conv_body(const tx_t *restrict X, const float *restrict Wt,
                      const float *restrict bias, const float *restrict add,
                      const float *restrict chan, const float *restrict xq, ty_t *restrict Y,
                      float *ws, int tid, int nth, int packed) {{
  (void)chan; (void)xq;
{head}{pack}  if (!packed) {{
    long lo, hi; split_range(WPACK_ITEMS, tid, nth, &lo, &hi); pack_weights(Wt, Wb_ws, lo, hi);
  }}
  {barrier}
  {oc_range}
  {pb_range}
  {qt_range}
{_tile_nest(s, x_at, w_at, dispatch, after, band, kcb)}
{tail}}}
"""


def generate_direct(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    dims = op.dims_dict
    plan = direct_plan(op, s)
    P, Q = op.out_h, op.out_w
    th, tw = plan.th, plan.tw
    off_wb = round_up(plan.xb_floats, ALIGN_FLOATS)
    ws_floats = off_wb + round_up(plan.wb_floats, ALIGN_FLOATS)
    npb = ceil_div(P, th)
    nqt = ceil_div(Q, tw)
    th_tail, tw_tail = P - (npb - 1) * th, Q - (nqt - 1) * tw

    constants: dict[str, int | str] = {
        **shape_constants(op), "OCB": s.oc_block, "ICB": plan.icb, "NCB": plan.ncb, "NFB": plan.nfb,
        "TH": th, "TW": tw, "NGF": plan.ngf, "NPB": npb, "NQT": nqt, "OFF_WB": off_wb,
        "WB_FLOATS": plan.wb_floats}
    if plan.xi:
        constants.update(XI=plan.xi, CBX=ceil_div(dims["C"], plan.xi))
    if plan.source == "band":
        constants.update(BAND_ROWS=band_rows(op, s), BAND_TILES=band_tiles(op, s),
                         BAND_FLOATS=band_floats(op, s))
    if not plan.depthwise:
        rows = "BAND_ROWS" if plan.source == "band" else "HP"
        constants["XCB"] = f"({rows} * WP * ICB)"  # floats from one input block to the next
    if plan.xo:
        constants.update(XO=plan.xo, CBY=ceil_div(dims["F"], plan.xo))
    if plan.bias_floats:
        stride = round_up(plan.bias_floats, ALIGN_FLOATS)
        constants.update(OFF_BP=ws_floats, BP_FLOATS=plan.bias_floats, BP_STRIDE=stride)
        ws_floats += s.threads * stride
    kcb = reduction_chunk(op, s, plan, d.name)
    if kcb:
        tile_floats = th * tw * s.oc_block
        stride = round_up(span_tiles(op, s, plan) * tile_floats, ALIGN_FLOATS)
        constants.update(KCB=kcb, TILE_FLOATS=tile_floats, OFF_PART=ws_floats,
                         PART_STRIDE=stride)
        ws_floats += s.threads * stride
    out = [preamble(d, constants, s.threads), *filter(None, [scalar_helpers(op.epilogue)]),
           bf16_scalar(op), y_storage(op), x_storage(op), pack_code(plan)]
    flat = flat_taps(op, s, plan.depthwise)
    if flat:
        out.append(tap_table(op))
    prefetch_next = prefetch_next_weights(op, npb * nqt)
    variants = {(th, tw): "ukr_full"}
    variants.setdefault((th, tw_tail), "ukr_qtail")
    variants.setdefault((th_tail, tw), "ukr_ptail")
    variants.setdefault((th_tail, tw_tail), "ukr_corner")
    for (vh, vw), name in variants.items():
        out.append(direct_ukr(name, vh, vw, s, d, plan.depthwise, plan.xi, flat, prefetch_next,
                              chunked=bool(kcb)))
    out.append(store_tile_code(op, s, d.lanes, plan))
    out.append(_conv_body(op, s, d, plan, variants, kcb))
    out.append(conv2d_entries(op, s.threads, f"{ws_floats}L", prepack=True, chain=True))
    return "\n".join(out)
