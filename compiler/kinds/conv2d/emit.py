"""C code for conv2d: blocked direct convolution and implicit GEMM, both with fused epilogues.

Same ABI as every kernel (``tc_kernel(void **args)`` / ``tc_time``), arguments in
:meth:`OpSignature.arguments` order (``X, W[, bias][, add], Y``), shapes as compile-time
constants. Layout conversions happen inside the kernel, so they are part of its measured time;
blocked layouts (``nchw{x}c``, :class:`_DirectPlan`) skip most of them: a blocked input is
read in place or copied row by row with its zero border, a blocked output gets whole vectors.

``direct`` (NCHW[x]c): the input is copied once per call into a zero-padded, channel-blocked
layout ``Xb[N][G][C/icb][Hp][Wp][icb]`` (padding done here, so the inner loops have no bounds
checks) and the weights into ``Wb[G][F/ocb][C/icb][R][S][icb][ocb]`` (zero-padded to whole
blocks). A register tile holds ``oh x ow`` output pixels x ``ocb`` output channels (vectors);
for every (channel block, r, s, c) it loads ``ocb/lanes`` weight vectors and broadcasts one
input scalar per pixel — GEMM's outer product with pixels as rows. The whole reduction stays
in registers; the finished tile goes through a small buffer to the NCHW output with bias,
residual add and relu applied. Depthwise convolutions (one channel per group) vectorise over
channels instead: ``Xb[N][C/ocb][Hp][Wp][ocb]``, one weight vector per tap, one input vector
per pixel.

``gemm`` (implicit GEMM): per group, ``Y[F,P*Q] = W[F,C*R*S] @ im2col(X)``. The weights are
packed into ``oc_block``-row panels (the A operand, broadcast), the im2col matrix is never
materialised: each thread packs a ``ic_block*R*S x ow_block`` panel of it on the fly (the B
operand, loaded as vectors along output pixels), and the micro-kernel writes NCHW output rows
directly. Partial tiles go through a local tile merged by scalar code, as in matmul.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, replace

from tunecache.compiler.codegen.abi import (
    ALIGN_FLOATS,
    preamble,
)
from tunecache.compiler.codegen.epilogue import render
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.codegen.microkernel import (
    KEEP_IN_REGISTER,
    Loop,
    Store,
    Tile,
    micro_kernel,
    store,
)
from tunecache.compiler.hardware import isa_levels
from tunecache.compiler.kinds.conv2d.common import conv2d_entries, shape_constants
from tunecache.compiler.kinds.conv2d.space import (
    Conv2dSchedule,
    conv2d_blocks,
    direct_tile,
    flat_pixels,
    is_depthwise,
    plane_buffer_floats,
)
from tunecache.compiler.kinds.conv2d.winograd import generate_winograd
from tunecache.compiler.mathutil import ceil_div, round_up
from tunecache.compiler.ops import OpSignature


def _epilogue_scalar(op: OpSignature, v: str, f: str, off: str) -> str:
    """C statements applying the epilogue to float ``v`` of channel ``f`` at output ``off``."""
    return render(op.epilogue, v, {"bias": f"bias[{f}]", "add": f"add[{off}]"}, vector=False)


def generate_conv2d(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    """The C translation unit for the conv2d ``op`` under ``s`` (validated by the caller)."""
    if s.algorithm == "gemm":
        return _generate_gemm(op, s, d)
    if s.algorithm == "winograd":
        return generate_winograd(op, s, d)
    if not s.pack_w:
        return _generate_plane(op, s, d)
    if flat_pixels(op):
        return _generate_direct(*_flattened(op, s), d)
    return _generate_direct(op, s, d)


def _flattened(op: OpSignature, s: Conv2dSchedule) -> tuple[OpSignature, Conv2dSchedule]:
    """The same convolution over images of one row of ``H*W`` pixels (the same memory in
    every layout, :func:`flat_pixels`) and the schedule whose tiles are one row of
    :func:`direct_tile`'s pixels on it."""
    d = op.dims_dict
    dims = tuple((k, 1 if k == "H" else d["H"] * d["W"] if k == "W" else v) for k, v in op.dims)
    return replace(op, dims=dims), s.replace(oh_block=1, ow_block=direct_tile(op, s)[1])


# -- depthwise plane kernel -------------------------------------------------------------------


def _plane_sweep(op: OpSignature, tile: Tile, unroll_kw: int) -> list[str]:
    """C lines zeroing ``tile`` and accumulating its R x S taps by a sweep down the input rows.

    Per kernel column ``s``, the R weights of that column sit in registers and every input
    vector the tile reads is loaded once, then FMA'd into each output row it feeds (output
    row ``i`` reads input row ``i * SH + r * DH``): a 3x3 tile of ``th`` rows loads ``th + 2``
    vectors per column instead of ``3 * th``, and each row's taps spread over independent
    chains. On the AVX2 Zen 3 VM, MobileNet-v2's 144-channel 56x56 depthwise 3x3 with 4 x 8
    tiles ran 0.86-0.88x the time of the tap-by-tap kernel (same schedule, same run).
    """
    d = op.dims_dict
    feeds: dict[int, list[tuple[int, int]]] = {}
    for i in range(len(tile.rows)):
        for r in range(d["R"]):
            feeds.setdefault(i * d["stride_h"] + r * d["dil_h"], []).append((i, r))
    lines = ["  vec " + ", ".join(f"{tile.acc(i, v)} = VZERO()" for v in range(tile.vectors)) + ";"
             for i in range(len(tile.rows))]
    if unroll_kw:
        lines.append("#pragma GCC unroll 16")
    lines += ["  for (long s = 0; s < S; s++) {",
              "    const float *base = buf + ((s * DW) % SW) * PLANE + p0 * SH * PW + q0"
              " + (s * DW) / SW;",
              "    const vec " + ", ".join(f"k{r} = VSET1(w[{r} * S + s])"
                                         for r in range(d["R"])) + ";"]
    for u, pairs in sorted(feeds.items()):
        for v in range(tile.vectors):
            fmas = " ".join(f"{tile.acc(i, v)} = VFMA(x, k{r}, {tile.acc(i, v)});"
                            for i, r in pairs)
            lines.append(f"    {{ vec x = VLOADU(base + {u} * PW + {v * tile.lanes}); VKEEP(x); "
                         f"{fmas} }}")
    return [*lines, "  }"]


def _plane_tile(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    """One TH x QV output tile of one channel: accumulators over R x S taps (one broadcast
    weight times a vector of output columns per row), then the epilogue, stored straight into
    NCHW rows (full tiles) or through a scratch tile."""
    th = s.oh_block
    tile = Tile(tuple(str(i) for i in range(th)), s.ow_block // d.lanes, d.lanes)
    full = Store(tuple(f"y + (p0 + {i}) * Q + q0" for i in range(th)), epilogue=op.epilogue,
                 operands={"bias": "VSET1(bias_c)", "add": "VLOADU(addp + (p0 + {r}) * Q + q0 + {o})"})
    scratch = Store(tuple(f"tile + {i * s.ow_block}" for i in range(th)))
    epi = render(op.epilogue, "v", {"bias": "bias_c", "add": "addp[(p0 + i) * Q + q0 + j]"},
                 vector=False)
    return "\n".join([
        "static inline void plane_tile(const float *restrict buf, const float *restrict w,",
        "                              float *restrict y, const float *restrict addp,",
        "                              float bias_c, long p0, long q0, long th, long tw) {",
        "  (void)addp; (void)bias_c;",
        *_plane_sweep(op, tile, s.unroll_kw),
        "  if (th == TH && tw == QV) {",
        *store(tile, full),
        "    return;",
        "  }",
        "  float tile[TH * QV];",
        *store(tile, scratch),
        "  for (long i = 0; i < th; i++)",
        "    for (long j = 0; j < tw; j++) {",
        "      float v = tile[i * QV + j];",
        f"      {epi}",
        "      y[(p0 + i) * Q + q0 + j] = v;",
        "    }",
        "}",
    ])


def _generate_plane(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    """Depthwise conv2d straight from NCHW: per channel, the zero-padded input plane split
    into ``stride_w`` column phases (phase k holds padded columns k, k+SW, ...) in a
    per-thread buffer, so every tap of a tile is a unit-stride vector load; output columns
    fill the lanes. No layout conversion of input, weights or output."""
    rows, width, floats = plane_buffer_floats(op, s)
    buf_floats = round_up(floats, ALIGN_FLOATS)
    constants = {**shape_constants(op), "TH": s.oh_block, "QV": s.ow_block, "PW": width,
                 "PLANE": f"({rows}L * PW)", "BUF_FLOATS": buf_floats,
                 "NPB": ceil_div(op.out_h, s.oh_block), "NQT": ceil_div(op.out_w, s.ow_block)}
    out = [preamble(d, constants, s.threads), KEEP_IN_REGISTER]
    out.append("""\
/* Channel plane x (H x W) into buf: phase (PL + iw) % SW, row PT + ih, column (PL + iw) / SW.
 * Only interior positions are written: the zero padding, set once per call, stays. */
static void fill_plane(const float *restrict x, float *restrict buf) {
  for (long ih = 0; ih < H; ih++) {
    const float *restrict src = x + ih * W;
    float *restrict row = buf + (PT + ih) * PW;
    if (SW == 1) {
      memcpy(row + PL, src, sizeof(float) * W);
    } else {
      for (long k = 0; k < SW; k++) {
        /* padded columns wp = PL + iw with wp % SW == k, in order: a strided read and a
         * unit-stride write, no division per element */
        const long iw0 = ((k - PL) % SW + SW) % SW;
        float *restrict dst = row + k * PLANE + (PL + iw0) / SW;
        for (long iw = iw0, j = 0; iw < W; iw += SW, j++) dst[j] = src[iw];
      }
    }
  }
}
""")
    out.append(_plane_tile(op, s, d))
    out.append("""
static void conv_body(const float *restrict X, const float *restrict Wt,
                      const float *restrict bias, const float *restrict add, float *restrict Y,
                      float *ws, int tid, int nth, int packed) {
  (void)packed; (void)bias; (void)add;
  float *buf = ws + tid * BUF_FLOATS;
  memset(buf, 0, sizeof(float) * BUF_FLOATS);
  long lo, hi;
  split_range(NB * C, tid, nth, &lo, &hi);
  for (long t = lo; t < hi; t++) {
    const long c = t % C;
    fill_plane(X + t * H * W, buf);
    const float *w = Wt + c * R * S;
    float *y = Y + t * P * Q;
    const float *addp = add ? add + t * P * Q : NULL;
    const float bias_c = bias ? bias[c] : 0.0f;
    for (long pb = 0; pb < NPB; pb++) {
      const long p0 = pb * TH, th = MIN(TH, P - p0);
      for (long qt = 0; qt < NQT; qt++) {
        const long q0 = qt * QV, tw = MIN(QV, Q - q0);
        plane_tile(buf, w, y, addp, bias_c, p0, q0, th, tw);
      }
    }
  }
}
""")
    out.append(conv2d_entries(op, s.threads, f"{s.threads}L * BUF_FLOATS", prepack=False))
    return "\n".join(out)


# -- direct ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _DirectPlan:
    """Sizes and data paths of one direct kernel.

    ``source`` is how the input reaches the tile: ``nchw`` (copied into the zero-padded
    blocked buffer ``Xb``), ``view`` (a blocked input without padding read in place),
    ``rows`` (a blocked input copied row by row into ``Xb`` with its zero border), ``band``
    (a depthwise kernel's blocked input: the padded rows a few row tiles read, copied into a
    small per-thread buffer just before its tiles) or
    ``gather`` (a blocked input whose blocks do not match the channel blocks, copied element
    by element). ``sink`` is how the tile reaches Y: ``nchw`` (through the scratch tile and
    :func:`store_tile`, transposed), ``vector`` (the scratch tile's vectors stored whole into a
    blocked Y) or ``scalar`` (a grouped convolution's tile into a blocked Y, element by
    element).
    """

    depthwise: bool
    xi: int
    xo: int
    icb: int
    ncb: int
    nfb: int
    ngf: int
    th: int
    tw: int
    source: str
    sink: str
    xb_floats: int
    wb_floats: int
    bias_floats: int


def _direct_plan(op: OpSignature, s: Conv2dSchedule) -> _DirectPlan:
    dims = op.dims_dict
    depthwise = is_depthwise(op)
    xi, xo = conv2d_blocks(op)
    groups = dims["groups"]
    cg = dims["C"] // groups
    fg = dims["F"] // groups
    icb = 1 if depthwise else min(s.ic_block, cg)
    # A blocked Y's padding lanes are computed like channels (zero weights and bias), so
    # tiles cover whole blocks; a grouped convolution's tiles do not (its sink zeroes them).
    covers_blocks = bool(xo) and (depthwise or groups == 1)
    if depthwise:
        ncb = ceil_div(round_up(dims["C"], xo) if covers_blocks else dims["C"], s.oc_block)
        nfb = ceil_div(fg, s.oc_block)
        ngf = ncb  # channel blocks
    else:
        ncb = ceil_div(cg, icb)
        nfb = ceil_div(round_up(fg, xo) if covers_blocks else fg, s.oc_block)
        ngf = groups * nfb
    hp = dims["H"] + dims["pad_t"] + dims["pad_b"]
    wp = dims["W"] + dims["pad_l"] + dims["pad_r"]
    if not xi:
        source = "nchw"
    elif depthwise or (icb == xi and (groups == 1 or cg % xi == 0)):
        padded = any(dims[k] for k in ("pad_t", "pad_l", "pad_b", "pad_r"))
        banded = depthwise or _dense_band(op, s)
        source = ("band" if banded else "rows") if padded else "view"
    else:
        source = "gather"
    sink = "nchw" if not xo else "vector" if covers_blocks else "scalar"
    if source == "view":
        xb_floats = 0
    elif source == "band":
        xb_floats = s.threads * _band_floats(op, s)
    elif source == "rows":
        xb_floats = dims["N"] * ceil_div(dims["C"], xi) * hp * wp * xi
    elif depthwise:
        xb_floats = dims["N"] * ncb * hp * wp * s.oc_block
    else:
        xb_floats = dims["N"] * groups * ncb * hp * wp * icb
    if depthwise:
        wb_floats = ncb * dims["R"] * dims["S"] * s.oc_block
    else:
        wb_floats = groups * nfb * ncb * dims["R"] * dims["S"] * icb * s.oc_block
    bias_floats = ngf * s.oc_block if sink == "vector" and "bias" in op.epilogue else 0
    return _DirectPlan(depthwise, xi, xo, icb, ncb, nfb, ngf, min(s.oh_block, op.out_h),
                       min(s.ow_block, op.out_w), source, sink, xb_floats, wb_floats,
                       bias_floats)


# Consecutive row tiles of one channel block share all but a stride's worth of input rows:
# a band of one tile copied a 3x3 stride-1 layer's input three times (at 14x14, 1 MB of
# copies for a 300 KB input, most of the layer's time). A band of several tiles copies each
# row about once; the budget keeps it in L2 (64 KiB measured best for MobileNet-v2's
# stride-1 layers on Zen 4: 0.97 ms of depthwise time per run against 1.05 ms). A stride-2
# tile shares one row of three with the next, and there a band that left L1 cost more than
# the copies it saved (the 112x112 layer: 0.235 ms against 0.215 ms), so it keeps one tile.
_BAND_BUDGET_FLOATS = 16 * 1024


DENSE_BAND_OVERLAP = 1.5
"""A dense band copies the padded input rows one row tile reads, so rows that two tiles share
are copied twice: bands are used where a tile's rows come to at most this many times the
rows it advances (a stride-2 tile of one row reads 3 and advances 2)."""


def _dense_band(op: OpSignature, s: Conv2dSchedule) -> bool:
    """Whether a dense direct kernel of ``op`` under ``s`` copies its padded blocked input in
    bands of rows, one row tile at a time (``pf``, one group, little overlap), rather than
    whole. DenseNet-121's stride-1 3x3 layers, whose one-row tiles read three rows to
    advance one, ran 1.16-1.19x in bands."""
    th = min(s.oh_block, op.out_h)
    advance = th * op.dim("stride_h")
    return (DENSE_ROW_BANDS and op.dim("groups") == 1 and s.loop_order == "pf"
            and _rows_for_tiles(op, th, 1) <= DENSE_BAND_OVERLAP * advance)


def _rows_for_tiles(op: OpSignature, th: int, tiles: int) -> int:
    dims = op.dims_dict
    return (tiles * th - 1) * dims["stride_h"] + (dims["R"] - 1) * dims["dil_h"] + 1


def _band_tiles(op: OpSignature, s: Conv2dSchedule) -> int:
    """Row tiles one band holds: as many as fit the budget when the loops visit a channel
    block's row tiles one after another (``fp``) at stride 1; else one (with ``pf`` every
    tile changes block)."""
    th = min(s.oh_block, op.out_h)
    if s.loop_order != "fp" or op.dim("stride_h") > 1:
        return 1
    row = (op.dim("W") + op.dim("pad_l") + op.dim("pad_r")) * conv2d_blocks(op)[0]
    tiles = 1
    while (tiles * th < op.out_h
           and _rows_for_tiles(op, th, tiles + 1) * row <= _BAND_BUDGET_FLOATS):
        tiles += 1
    return tiles


def _band_rows(op: OpSignature, s: Conv2dSchedule) -> int:
    """Padded input rows one band holds: those :func:`_band_tiles` row tiles read."""
    return _rows_for_tiles(op, min(s.oh_block, op.out_h), _band_tiles(op, s))


def _band_floats(op: OpSignature, s: Conv2dSchedule) -> int:
    """One thread's band buffer: :func:`_band_rows` padded rows of one input block (of
    every block for a dense kernel)."""
    dims = op.dims_dict
    xi, _ = conv2d_blocks(op)
    wp = dims["W"] + dims["pad_l"] + dims["pad_r"]
    blocks = 1 if is_depthwise(op) else ceil_div(dims["C"], xi)
    return round_up(blocks * _band_rows(op, s) * wp * xi, ALIGN_FLOATS)


FLAT_TAPS_MAX_IC = 4
"""Dense direct tiles whose input-channel block is at most this (a stem on NCHW input, one or
three channels a block) and whose kernel has at least :data:`FLAT_TAPS_MIN` taps run the
taps as one loop over :func:`tap_table`'s offsets. Nested row and column loops of seven
iterations around a one-channel body made GCC rotate the accumulators between registers and
spill them at every kernel row; a 3x3 kernel's short loops it unrolls, and there the nested
form ran faster (ARCHITECTURE change 70)."""
FLAT_TAPS_MIN = 25


def flat_taps(op: OpSignature, s: Conv2dSchedule, depthwise: bool) -> bool:
    """Whether a direct tile of ``s`` runs ``op``'s taps as one loop (:data:`FLAT_TAPS_MAX_IC`)."""
    dims = op.dims_dict
    return (not depthwise and s.ic_block <= FLAT_TAPS_MAX_IC
            and dims["R"] * dims["S"] >= FLAT_TAPS_MIN)


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


PREFETCH_NEXT_WEIGHTS = True
"""Off, no tile prefetches the next block's weights: the switch an A/B of change 71 flips."""
PREFETCH_MAX_TILES = 2
"""A 1x1 direct tile prefetches the next channel block's weights where an image has at most
this many pixel tiles: there nearly every prefetch brings a line the next block reads, while
the weights' stream from memory dominates (ResNet-50's 1x1 layers at 7x7, 2 tiles: 0.77-0.80x
their time on the AVX-512 Xeon VM). With many tiles each repeats its block's prefetches, and
the 28x28 and 56x56 layers ran 1.12-1.24x (ARCHITECTURE change 71)."""


def _prefetch_next_weights(op: OpSignature, tiles: int) -> bool:
    """Whether a dense direct tile of ``op`` prefetches the next channel block's weights
    (:data:`PREFETCH_MAX_TILES`): a 1x1 kernel over ``tiles`` pixel tiles per image."""
    return (PREFETCH_NEXT_WEIGHTS and op.dim("R") * op.dim("S") == 1
            and tiles <= PREFETCH_MAX_TILES and not is_depthwise(op))


DENSE_ROW_BANDS = True
"""Off, a dense pf kernel on a padded blocked input copies the whole padded input per call
(``rows``) instead of a band of rows per row tile (the switch an A/B flips)."""

CHUNK_WEIGHT_BYTES = 16 * 1024
"""A dense direct tile whose weights (all its input channels, every tap) exceed this reduces
them in chunks of at most this many bytes, each chunk over every tile of its span before the
next: the chunk stays in L1 while the tiles reuse it, instead of streaming from L2 once per
tile. 0 turns chunking off (the switch an A/B flips)."""
CHUNK_MIN_CHUNKS = 4
"""Weights of fewer chunks than this reduce in one pass."""
CHUNK_PART_BYTES = 256 * 1024
"""Most bytes of partial sums one thread keeps for a chunked span (its tiles' scratch)."""
CHUNK_MIN_REGISTERS = 32
"""Only ISAs with this many vector registers chunk (AVX-512, where it was measured). With
AVX2 kernels on the same Xeon (8-channel blocks, 16 registers) ResNet-50's stride-2 3x3
layers ran 1.32-1.52x as long chunked, its 1x1 layers 0.97-1.00x, the model 1.06x."""


def chunk_blocks(op: OpSignature, s: Conv2dSchedule, plan: _DirectPlan, span_tiles: int) -> int:
    """Channel blocks per reduction chunk of a dense direct kernel whose chunk loop spans
    ``span_tiles`` tiles (:data:`CHUNK_WEIGHT_BYTES`); 0 where it reduces in one pass: a
    depthwise or flat-tap tile, weights that fit the budget, a span of one tile or partial
    sums beyond :data:`CHUNK_PART_BYTES`."""
    dims = op.dims_dict
    block_bytes = dims["R"] * dims["S"] * plan.icb * s.oc_block * 4
    part_bytes = span_tiles * plan.th * plan.tw * s.oc_block * 4
    if (not CHUNK_WEIGHT_BYTES or plan.depthwise or flat_taps(op, s, plan.depthwise)
            or plan.ncb * block_bytes < CHUNK_MIN_CHUNKS * CHUNK_WEIGHT_BYTES or span_tiles < 2
            or part_bytes > CHUNK_PART_BYTES):
        return 0
    return max(1, CHUNK_WEIGHT_BYTES // block_bytes)


def _span_tiles(op: OpSignature, s: Conv2dSchedule, plan: _DirectPlan) -> int:
    """Tiles one chunk loop spans (:func:`_tile_nest`): with ``fp`` the image's, with ``pf``
    one pixel row's."""
    nqt = ceil_div(op.out_w, plan.tw)
    return ceil_div(op.out_h, plan.th) * nqt if s.loop_order == "fp" else nqt


def _reduction_chunk(op: OpSignature, s: Conv2dSchedule, plan: _DirectPlan, isa: str) -> int:
    """:func:`chunk_blocks` for the direct kernel of ``op`` under ``s`` at ``isa``; 0 where a
    1x1 tile prefetches the next block's weights instead (:func:`_prefetch_next_weights`)
    and below :data:`CHUNK_MIN_REGISTERS`."""
    tiles = ceil_div(op.out_h, plan.th) * ceil_div(op.out_w, plan.tw)
    if (_prefetch_next_weights(op, tiles)
            or isa not in isa_levels() or isa_levels()[isa].vector_registers < CHUNK_MIN_REGISTERS):
        return 0
    return chunk_blocks(op, s, plan, _span_tiles(op, s, plan))


def reduces_in_chunks(op: OpSignature, s: Conv2dSchedule, isa: str) -> bool:
    """Whether the direct kernel of ``op`` under ``s`` at ``isa`` reduces its weights in
    L1-sized chunks (:func:`chunk_blocks`)."""
    if s.algorithm != "direct" or not s.pack_w:
        return False
    if flat_pixels(op):
        op, s = _flattened(op, s)
    return bool(_reduction_chunk(op, s, _direct_plan(op, s), isa))


def direct_ukr(name: str, th: int, tw: int, s: Conv2dSchedule, d: IsaDialect,
                depthwise: bool, xi: int = 0, flat: bool = False,
                prefetch_next: bool = False, chunked: bool = False) -> str:
    """A register tile of ``th`` x ``tw`` pixels (rows) x OCB channels (vectors) over the whole
    reduction, stored to the aligned scratch ``tile`` for :func:`store_tile`'s epilogue.

    Dense: per input channel, OCB weights as vectors times each pixel's input broadcast.
    Depthwise: per tap, OCB weights times each pixel's OCB channels, both vectors (read from
    ``Xb``'s OCB-channel pixels, or with ``xi`` from a blocked input's ``xi``-channel pixels).
    ``flat``: one loop over the taps of ``TAP_X`` (:func:`flat_taps`) instead of rows and
    columns. ``prefetch_next``: each input-channel step prefetches the next channel block's
    weights (:func:`_prefetch_next_weights`). ``chunked`` (dense): the tile reduces ``ncb``
    channel blocks and adds its sums to the scratch tile unless ``first``
    (:func:`chunk_blocks`).
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
                                        "add": f"VLOADU(ad + {off})"}, vector=True)
        put = (f"{{ vec t = VLOAD(tile + (i * TW + j) * OCB + {v * lanes}); "
               f"{epi + ' ' if epi else ''}VSTOREU(y + {off}, t); }}")
        guard = f"if ({v} < vmax) " if v and s.oc_block > xo else ""
        lines.append(f"      {guard}{put}")
    body = "\n".join(lines)
    return f"""\
static void store_tile(const float *restrict tile, float *restrict y, const float *restrict bp,
                       const float *restrict ad, long th, long tw, long vmax) {{
  (void)bp; (void)ad; (void)vmax;
  for (long i = 0; i < th; i++)
    for (long j = 0; j < tw; j++) {{
{body}
    }}
}}
"""


_DW_PACK_INPUT = """\
/* Xb[n][cb][hp][wp][OCB]: zero-padded, channels blocked across groups. Items: (n, cb, hp). */
static void pack_input(const float *restrict X, float *restrict Xb, long lo, long hi) {
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
      const float *restrict src = X + ((n * C + c) * H + ih) * W;
      for (long iw = 0; iw < W; iw++) dst[(PL + iw) * OCB + o] = src[iw];
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
static void pack_input(const float *restrict X, float *restrict Xb, long lo, long hi) {
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
/* dst[r][wp][XI] = padded rows hp0 + r (r < rows) of input block nb (image and block). */
static inline void padded_rows(float *restrict dst, const float *restrict X, long nb, long hp0,
                               long rows) {
  for (long r = 0; r < rows; r++, dst += WP * XI) {
    const long ih = hp0 + r - PT;
    if (ih < 0 || ih >= H) { memset(dst, 0, sizeof(float) * WP * XI); continue; }
    memset(dst, 0, sizeof(float) * PL * XI);
    memcpy(dst + PL * XI, X + (nb * H + ih) * (W * XI), sizeof(float) * W * XI);
    memset(dst + (PL + W) * XI, 0, sizeof(float) * (WP - PL - W) * XI);
  }
}
"""

_ROWS_PACK_INPUT = _PADDED_ROWS + """\
/* Xb[n][b][hp][wp][XI]: the blocked input with its zero border. Items: (n, b, hp). */
static void pack_input(const float *restrict X, float *restrict Xb, long lo, long hi) {
  for (long t = lo; t < hi; t++)
    padded_rows(Xb + t * (WP * XI), X, t / HP, t % HP, 1);
}
"""

# A depthwise layer reads each input row only for the few output rows next to it: packing
# the whole padded input first wrote a copy as large as the input (5 MB for MobileNet-v2's
# 112x112 stride-2 layer) that left the caches before the tiles read it back, and in a
# model, where that buffer is cold, its writes cost as much as the convolution.
_BAND_PACK_INPUT = _PADDED_ROWS + """\
/* band[r][wp][XI] = padded rows hp0 + r (r < rows) of input block nb (image and block). */
static void pack_band(const float *restrict X, float *restrict band, long nb, long hp0,
                      long rows) {
  padded_rows(band, X, nb, hp0, rows);
}
"""

# A dense pf kernel reads a row tile's input rows for every output-channel block before it
# moves on: copying them (every channel block) into a small band just before, instead of the
# whole padded input once per call, keeps the copy's writes and the tiles' reads in cache. The
# whole copy (1.7 MB for ResNet-50's 128-channel stride-2 layer) cost 12-14% of that layer's
# time alone, its writes leaving L2 before the tiles read them back (change 80).
_DENSE_BAND_PACK_INPUT = _PADDED_ROWS + """\
/* band[cb][r][wp][XI] = padded rows hp0 + r (r < rows) of every input block of image n. */
static void pack_band(const float *restrict X, float *restrict band, long n, long hp0,
                      long rows) {
  for (long cb = 0; cb < CBX; cb++)
    padded_rows(band + cb * (BAND_ROWS * WP * XI), X, n * CBX + cb, hp0, rows);
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


def _pack_code(plan: _DirectPlan) -> str:
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


def _store_tile_code(op: OpSignature, s: Conv2dSchedule, lanes: int, plan: _DirectPlan) -> str:
    """``store_tile``: output channel f0 + o, o < fvalid, of the th x tw tile at (p0, q0) of
    image n, from the scratch tile into Y (NCHW, or blocked for the ``scalar`` sink), with
    the epilogue; the ``scalar`` sink also gets ``zero_lanes`` for Y's padding lanes. The
    ``vector`` sink's is :func:`blocked_store`."""
    if plan.sink == "vector":
        return blocked_store(op, s, lanes, plan.xo)
    if plan.sink == "scalar":
        epi = _epilogue_scalar(op, "v", "f", "o_off + j * XO")
        return f"""\
static void store_tile(const float *restrict tile, float *restrict Y, const float *restrict bias,
                       const float *restrict add, long n, long f0, long fvalid, long p0, long q0,
                       long th, long tw) {{
  (void)bias; (void)add;
  for (long o = 0; o < fvalid; o++) {{
    const long f = f0 + o;
    for (long i = 0; i < th; i++) {{
      const long o_off = ((n * CBY + f / XO) * P + p0 + i) * Q * XO + q0 * XO + f % XO;
      for (long j = 0; j < tw; j++) {{
        float v = tile[(i * TW + j) * OCB + o];
        {epi}
        Y[o_off + j * XO] = v;
      }}
    }}
  }}
}}

/* Y's lanes beyond F (the last block's padding) are zero. Items: (n, pixel). */
static void zero_lanes(float *restrict Y, long lo, long hi) {{
  for (long t = lo; t < hi; t++) {{
    float *restrict y = Y + ((t / (P * Q) * CBY + CBY - 1) * P * Q + t % (P * Q)) * XO;
    for (long l = F - (CBY - 1) * XO; l < XO; l++) y[l] = 0.0f;
  }}
}}
"""
    # With a vector tile epilogue the tile arrives finished: this store only transposes.
    vector = _vector_tile_epilogue(op)
    epi = "" if vector else _epilogue_scalar(op, "v", "f", "o_off + j")
    return (_tile_epilogue(op, s, lanes) if vector else "") + f"""\
static void store_tile(const float *restrict tile, float *restrict Y, const float *restrict bias,
                       const float *restrict add, long n, long f0, long fvalid, long p0, long q0,
                       long th, long tw) {{
  (void)bias; (void)add;
  for (long o = 0; o < fvalid; o++) {{
    const long f = f0 + o;
    for (long i = 0; i < th; i++) {{
      const long o_off = ((n * F + f) * P + p0 + i) * Q + q0;
      float *restrict y = Y + o_off;
      for (long j = 0; j < tw; j++) {{
        float v = tile[(i * TW + j) * OCB + o];
        {epi}
        y[j] = v;
      }}
    }}
  }}
}}
"""


def _vector_tile_epilogue(op: OpSignature) -> bool:
    """Whether the ``nchw`` sink applies the epilogue to the scratch tile's channel vectors
    before transposing it (every epilogue without a residual: its operand is per channel),
    rather than per element on the way out (scalar ``FEXP`` for ``silu`` cost 3 ms of a
    144-channel 56x56 depthwise layer)."""
    return bool(op.epilogue) and "add" not in op.epilogue


def _tile_epilogue(op: OpSignature, s: Conv2dSchedule, lanes: int) -> str:
    """``tile_epilogue``: the epilogue on every vector of the scratch tile (channels
    ``f0 + o`` in the lanes; bias lanes from ``fvalid`` on read as 0, nothing past F)."""
    lines = []
    for v in range(s.oc_block // lanes):
        n = f"MIN({lanes}, MAX(0, fvalid - {v * lanes}))"
        epi = render(op.epilogue, "t", {"bias": f"VLOADU_PART(bias + f0 + {v * lanes}, {n})"},
                     vector=True)
        lines.append(f"    {{ vec t = VLOAD(tile + k * OCB + {v * lanes}); {epi} "
                     f"VSTORE(tile + k * OCB + {v * lanes}, t); }}")
    body = "\n".join(lines)
    return f"""\
#define MAX(x, y) ((x) > (y) ? (x) : (y))
static void tile_epilogue(float *restrict tile, const float *restrict bias, long f0,
                          long fvalid) {{
  (void)bias; (void)f0; (void)fvalid;
  for (long k = 0; k < TH * TW; k++) {{
{body}
  }}
}}
"""


def _tile_addresses(plan: _DirectPlan) -> tuple[str, str, str, str]:
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


_DENSE_BAND_REFRESH = """
      if (n != band_nb || p0 != band_p0) {
        pack_band(X, band, n, p0 * SH, MIN(BAND_ROWS, HP - p0 * SH));
        band_nb = n;
        band_p0 = p0;
      }"""

_BAND_REFRESH = """
      const long nb = n * CBX + (gf * OCB) / XI;
      if (nb != band_nb || p0 < band_p0 || p0 >= band_p0 + BAND_TILES * TH) {
        pack_band(X, band, nb, p0 * SH, MIN(BAND_ROWS, HP - p0 * SH));
        band_nb = nb;
        band_p0 = p0;
      }"""


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


def _conv_body(op: OpSignature, s: Conv2dSchedule, d: IsaDialect, plan: _DirectPlan,
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
        band = _BAND_REFRESH if plan.depthwise else _DENSE_BAND_REFRESH
    else:
        head = "  float *Xb = ws, *Wb_ws = ws + OFF_WB;\n"
        pack = ("  { long lo, hi; split_range(PACK_ITEMS, tid, nth, &lo, &hi); "
                "pack_input(X, Xb, lo, hi); }\n")
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
        nv = s.oc_block // d.lanes
        vmax = f"MIN({nv}, (CBY * XO - f0) / {d.lanes})" if s.oc_block > plan.xo else str(nv)
        after = f"""
        const long f0 = {f0};
        float *yp = Y + ((n * CBY + f0 / XO) * P + p0) * Q * XO + q0 * XO + f0 % XO;
        store_tile(tile, yp, {bp}, add ? add + (yp - Y) : NULL, th, tw, {vmax});"""
    elif plan.sink == "nchw" and _vector_tile_epilogue(op):
        after = (f"\n        tile_epilogue(tile, bias, {f0}, {fvalid});"
                 f"\n        store_tile(tile, Y, bias, add, n, {f0}, {fvalid}, p0, q0, th, tw);")
    else:
        after = f"\n        store_tile(tile, Y, bias, add, n, {f0}, {fvalid}, p0, q0, th, tw);"
    # Threads wait for each other only for what they packed together.
    barrier = "BARRIER();" if pack else "if (!packed) { BARRIER(); }"
    tail = ""
    if plan.sink == "scalar" and op.dim("F") % plan.xo:
        tail = ("  { long lo, hi; split_range(NB * P * Q, tid, nth, &lo, &hi); "
                "zero_lanes(Y, lo, hi); }\n")
    return f"""\
static void conv_body(const float *restrict X, const float *restrict Wt,
                      const float *restrict bias, const float *restrict add, float *restrict Y,
                      float *ws, int tid, int nth, int packed) {{
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


def _generate_direct(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    dims = op.dims_dict
    plan = _direct_plan(op, s)
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
        constants.update(BAND_ROWS=_band_rows(op, s), BAND_TILES=_band_tiles(op, s),
                         BAND_FLOATS=_band_floats(op, s))
    if not plan.depthwise:
        rows = "BAND_ROWS" if plan.source == "band" else "HP"
        constants["XCB"] = f"({rows} * WP * ICB)"  # floats from one input block to the next
    if plan.xo:
        constants.update(XO=plan.xo, CBY=ceil_div(dims["F"], plan.xo))
    if plan.bias_floats:
        stride = round_up(plan.bias_floats, ALIGN_FLOATS)
        constants.update(OFF_BP=ws_floats, BP_FLOATS=plan.bias_floats, BP_STRIDE=stride)
        ws_floats += s.threads * stride
    kcb = _reduction_chunk(op, s, plan, d.name)
    if kcb:
        tile_floats = th * tw * s.oc_block
        stride = round_up(_span_tiles(op, s, plan) * tile_floats, ALIGN_FLOATS)
        constants.update(KCB=kcb, TILE_FLOATS=tile_floats, OFF_PART=ws_floats,
                         PART_STRIDE=stride)
        ws_floats += s.threads * stride
    out = [preamble(d, constants, s.threads), _pack_code(plan)]
    flat = flat_taps(op, s, plan.depthwise)
    if flat:
        out.append(tap_table(op))
    prefetch_next = _prefetch_next_weights(op, npb * nqt)
    variants = {(th, tw): "ukr_full"}
    variants.setdefault((th, tw_tail), "ukr_qtail")
    variants.setdefault((th_tail, tw), "ukr_ptail")
    variants.setdefault((th_tail, tw_tail), "ukr_corner")
    for (vh, vw), name in variants.items():
        out.append(direct_ukr(name, vh, vw, s, d, plan.depthwise, plan.xi, flat, prefetch_next,
                              chunked=bool(kcb)))
    out.append(_store_tile_code(op, s, d.lanes, plan))
    out.append(_conv_body(op, s, d, plan, variants, kcb))
    out.append(conv2d_entries(op, s.threads, f"{ws_floats}L", prepack=True))
    return "\n".join(out)


# -- gemm (implicit GEMM) -----------------------------------------------------------------------


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
    """The plan :func:`_generate_gemm` renders ``op`` under ``s`` from."""
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


def _generate_gemm(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    """The implicit-GEMM kernel: its plan (:func:`_gemm_plan`), then the C rendered from it."""
    plan = _gemm_plan(op, s, d)
    out = [preamble(d, plan.constants, s.threads)]
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
    epi = _epilogue_scalar(op, "v", "f", "off")
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
