"""What a direct conv2d kernel does, decided before any C is written.

:class:`DirectPlan` (its sizes and data paths: how the input reaches a tile, how a tile reaches
Y) and the choices behind it: copying a padded blocked input in bands of rows
(:data:`DENSE_ROW_BANDS`, :func:`band_rows`), running a stem's taps as one loop
(:func:`flat_taps`), prefetching the next channel block's weights
(:func:`prefetch_next_weights`) and reducing the weights in L1-sized chunks
(:func:`chunk_blocks`; :func:`reduces_in_chunks`, which the tuner asks too). A flat 1x1 image
is planned as one row of pixels (:func:`flattened`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tunecache.compiler.codegen.abi import ALIGN_FLOATS
from tunecache.compiler.hardware import isa_levels
from tunecache.compiler.kinds.conv2d.space import (
    Conv2dSchedule,
    conv2d_blocks,
    direct_tile,
    flat_pixels,
    is_depthwise,
)
from tunecache.compiler.mathutil import ceil_div, round_up
from tunecache.compiler.ops import OpSignature


def flattened(op: OpSignature, s: Conv2dSchedule) -> tuple[OpSignature, Conv2dSchedule]:
    """The same convolution over images of one row of ``H*W`` pixels (the same memory in
    every layout, :func:`flat_pixels`) and the schedule whose tiles are one row of
    :func:`direct_tile`'s pixels on it."""
    d = op.dims_dict
    dims = tuple((k, 1 if k == "H" else d["H"] * d["W"] if k == "W" else v) for k, v in op.dims)
    return replace(op, dims=dims), s.replace(oh_block=1, ow_block=direct_tile(op, s)[1])


@dataclass(frozen=True, slots=True)
class DirectPlan:
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


def direct_plan(op: OpSignature, s: Conv2dSchedule) -> DirectPlan:
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
        xb_floats = s.threads * band_floats(op, s)
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
    return DirectPlan(depthwise, xi, xo, icb, ncb, nfb, ngf, min(s.oh_block, op.out_h),
                      min(s.ow_block, op.out_w), source, sink, xb_floats, wb_floats,
                      bias_floats)


# Consecutive row tiles of one channel block share all but a stride's worth of input rows:
# a band of one tile copied a 3x3 stride-1 layer's input three times (at 14x14, 1 MB of
# copies for a 300 KB input, most of the layer's time). A band of several tiles copies each
# row about once; the budget keeps it in L2 (64 KiB measured best for MobileNet-v2's
# stride-1 layers on Zen 4: 0.97 ms of depthwise time per run against 1.05 ms). A stride-2
# tile shares one row of three with the next, and there a band that left L1 cost more than
# the copies it saved (the 112x112 layer: 0.235 ms against 0.215 ms), so it keeps one tile.
# The budget is for a band of 16-channel blocks; wider blocks get as many rows (a bf16
# depthwise layer's 32-channel tile-row blocks: MobileNet-v2's 32-channel 3x3 at 112x112 ran
# 0.173 ms with half the rows, 0.150 with as many, AMX Xeon).
_BAND_BUDGET_FLOATS = 16 * 1024


DENSE_BAND_OVERLAP = 1.5
"""A dense band copies the padded input rows one row tile reads, so rows that two tiles share
are copied twice: bands are used where a tile's rows come to at most this many times the
rows it advances (a stride-2 tile of one row reads 3 and advances 2)."""


DENSE_ROW_BANDS = True
"""Off, a dense pf kernel on a padded blocked input copies the whole padded input per call
(``rows``) instead of a band of rows per row tile (the switch an A/B flips)."""


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


def band_tiles(op: OpSignature, s: Conv2dSchedule) -> int:
    """Row tiles one band holds: as many as fit the budget when the loops visit a channel
    block's row tiles one after another (``fp``) at stride 1; else one (with ``pf`` every
    tile changes block)."""
    th = min(s.oh_block, op.out_h)
    if s.loop_order != "fp" or op.dim("stride_h") > 1:
        return 1
    block = conv2d_blocks(op)[0]
    row = (op.dim("W") + op.dim("pad_l") + op.dim("pad_r")) * block
    budget = _BAND_BUDGET_FLOATS * max(1, block // 16)
    tiles = 1
    while tiles * th < op.out_h and _rows_for_tiles(op, th, tiles + 1) * row <= budget:
        tiles += 1
    return tiles


def band_rows(op: OpSignature, s: Conv2dSchedule) -> int:
    """Padded input rows one band holds: those :func:`band_tiles` row tiles read."""
    return _rows_for_tiles(op, min(s.oh_block, op.out_h), band_tiles(op, s))


def band_floats(op: OpSignature, s: Conv2dSchedule) -> int:
    """One thread's band buffer: :func:`band_rows` padded rows of one input block (of
    every block for a dense kernel)."""
    dims = op.dims_dict
    xi, _ = conv2d_blocks(op)
    wp = dims["W"] + dims["pad_l"] + dims["pad_r"]
    blocks = 1 if is_depthwise(op) else ceil_div(dims["C"], xi)
    return round_up(blocks * band_rows(op, s) * wp * xi, ALIGN_FLOATS)


FLAT_TAPS_MAX_IC = 4
"""Dense direct tiles whose input-channel block is at most this (a stem on NCHW input, one or
three channels a block) and whose kernel has at least :data:`FLAT_TAPS_MIN` taps run the
taps as one loop over :func:`direct_tile.tap_table`'s offsets. Nested row and column loops of seven
iterations around a one-channel body made GCC rotate the accumulators between registers and
spill them at every kernel row; a 3x3 kernel's short loops it unrolls, and there the nested
form ran faster (ARCHITECTURE change 70)."""
FLAT_TAPS_MIN = 25


def flat_taps(op: OpSignature, s: Conv2dSchedule, depthwise: bool) -> bool:
    """Whether a direct tile of ``s`` runs ``op``'s taps as one loop (:data:`FLAT_TAPS_MAX_IC`)."""
    dims = op.dims_dict
    return (not depthwise and s.ic_block <= FLAT_TAPS_MAX_IC
            and dims["R"] * dims["S"] >= FLAT_TAPS_MIN)


PREFETCH_NEXT_WEIGHTS = True
"""Off, no tile prefetches the next block's weights: the switch an A/B of change 71 flips."""
PREFETCH_MAX_TILES = 2
"""A 1x1 direct tile prefetches the next channel block's weights where an image has at most
this many pixel tiles: there nearly every prefetch brings a line the next block reads, while
the weights' stream from memory dominates (ResNet-50's 1x1 layers at 7x7, 2 tiles: 0.77-0.80x
their time on the AVX-512 Xeon VM). With many tiles each repeats its block's prefetches, and
the 28x28 and 56x56 layers ran 1.12-1.24x (ARCHITECTURE change 71)."""


def prefetch_next_weights(op: OpSignature, tiles: int) -> bool:
    """Whether a dense direct tile of ``op`` prefetches the next channel block's weights
    (:data:`PREFETCH_MAX_TILES`): a 1x1 kernel over ``tiles`` pixel tiles per image."""
    return (PREFETCH_NEXT_WEIGHTS and op.dim("R") * op.dim("S") == 1
            and tiles <= PREFETCH_MAX_TILES and not is_depthwise(op))


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


def chunk_blocks(op: OpSignature, s: Conv2dSchedule, plan: DirectPlan, span_tiles: int) -> int:
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


def span_tiles(op: OpSignature, s: Conv2dSchedule, plan: DirectPlan) -> int:
    """Tiles one chunk loop spans (:func:`emit_direct._tile_nest`): with ``fp`` the image's, with ``pf``
    one pixel row's."""
    nqt = ceil_div(op.out_w, plan.tw)
    return ceil_div(op.out_h, plan.th) * nqt if s.loop_order == "fp" else nqt


def reduction_chunk(op: OpSignature, s: Conv2dSchedule, plan: DirectPlan, isa: str) -> int:
    """:func:`chunk_blocks` for the direct kernel of ``op`` under ``s`` at ``isa``; 0 where a
    1x1 tile prefetches the next block's weights instead (:func:`prefetch_next_weights`)
    and below :data:`CHUNK_MIN_REGISTERS`."""
    tiles = ceil_div(op.out_h, plan.th) * ceil_div(op.out_w, plan.tw)
    if (prefetch_next_weights(op, tiles)
            or isa not in isa_levels() or isa_levels()[isa].vector_registers < CHUNK_MIN_REGISTERS):
        return 0
    return chunk_blocks(op, s, plan, span_tiles(op, s, plan))


def reduces_in_chunks(op: OpSignature, s: Conv2dSchedule, isa: str) -> bool:
    """Whether the direct kernel of ``op`` under ``s`` at ``isa`` reduces its weights in
    L1-sized chunks (:func:`chunk_blocks`)."""
    if s.algorithm != "direct" or not s.pack_w:
        return False
    if flat_pixels(op):
        op, s = flattened(op, s)
    return bool(reduction_chunk(op, s, direct_plan(op, s), isa))
