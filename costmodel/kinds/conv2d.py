"""The cost model's side of ``conv2d``: the direct / implicit-GEMM / depthwise-plane
estimates and the conv2d schedule family's feature block."""

from __future__ import annotations

from tunecache.compiler.backends import ArchConstants
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.conv2d.lowp import (
    packed_channels,
    pixel_channels,
    plane_width,
    tiles_plane,
)
from tunecache.compiler.kinds.conv2d.space import (
    Conv2dSchedule,
    conv2d_blocks,
    direct_tile,
    flat_pixels,
    is_depthwise,
    pixel_grid,
)
from tunecache.compiler.kinds.conv2d.winograd import transform_ops, winograd_plan
from tunecache.compiler.ops import OpSignature
from tunecache.costmodel.analytic import (
    LATENCY_MARGIN,
    Estimate,
    ceil_div,
    constants,
    micro_efficiency,
    peak_gflops_per_core,
    round_up,
)
from tunecache.costmodel.kinds import CostKind, FeatureBlock, l2, register
from tunecache.costmodel.kinds.elementwise import HEAVY, STEP_OPS
from tunecache.costmodel.kinds.matmul import (
    FINISH_CYCLES_PER_VECTOR,
    TILE_LOAD_CYCLES,
    TILE_PRODUCT_CYCLES,
)

# Register tiles that broadcast (direct: pixels; implicit GEMM: channels) take the matmul's
# latency margin (analytic.LATENCY_MARGIN). Implicit GEMM: at AVX2 on Zen 4, ResNet-50's
# 56x56 64->64 1x1 ran 127-134 us with 12-accumulator tiles (4 x 3 and 6 x 2 vectors) against
# 158-161 us with 8-accumulator ones (8 x 1, 2 x 4). Direct (ARCHITECTURE change 56): on the
# AVX2 Zen 3 VM, blocked 1x1 layers ran 1.2-1.3 ms with 6 pixels x 2 vectors against 1.5 ms
# with 4 x 2. Depthwise plane tiles (a vector load per FMA) keep the plain rule.
CONV_MARGIN = 1.0


# What one channel block of a direct tile's reduction costs beyond its FMAs, in reduction
# steps (the window loops restart, the pointers move): small, but it prefers deep blocks
# where the weight panel still fits L1 (ResNet-50's 512->2048 1x1 at 7x7 took 256-channel
# blocks at AVX-512 before ARCHITECTURE change 57 stopped charging the tile's store per block).
_BLOCK_STEPS = 2


# What each window position of a direct tile costs beyond its FMAs when the kernel-width
# loop is not unrolled, in reduction steps. Measured on the AVX2 Zen 3 VM at one thread over
# ResNet-50's seven blocked 3x3 layers (8-channel blocks, so eight steps per position) and
# four tiles each: the unrolled loop ran faster in 24 of 28 pairs, by 1.3-2.8x (the 128-
# channel stride-2 layer: 3.3 against 9.1 ms with 16 channels x 6 pixels); on NCHW input
# with 64-channel blocks, and on the stems' one- and three-channel blocks, neither won.
_POSITION_STEPS = 4


def _loop_steps(op: OpSignature, s: Conv2dSchedule, blocks: int) -> int:
    """A direct tile's loop overhead per call in reduction steps: per channel block, and on
    a blocked input per window position of each block unless the kernel-width loop is
    unrolled."""
    d = op.dims_dict
    steps = _BLOCK_STEPS * blocks
    if d["S"] > 1 and not s.unroll_kw and conv2d_blocks(op)[0]:
        steps += _POSITION_STEPS * blocks * d["R"] * d["S"]
    return steps


def _margin(op: OpSignature, s: Conv2dSchedule) -> float:
    broadcasts = s.algorithm == "gemm" or (s.algorithm == "direct" and not is_depthwise(op))
    return LATENCY_MARGIN if broadcasts else CONV_MARGIN


def _conv_dims(op: OpSignature) -> tuple[int, int, int, int, int, int, int, bool]:
    d = op.dims_dict
    groups = d["groups"]
    depthwise = groups == d["C"] and d["F"] == d["C"]
    return (d["N"], groups, d["C"] // groups, d["F"] // groups, op.out_h, op.out_w,
            d["R"] * d["S"], depthwise)


def estimate_conv2d(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> Estimate:
    """Roofline-style estimate for a conv2d schedule, seen as the GEMM it computes.

    Per image and group the convolution is a GEMM of output channels x output pixels x
    (input channels x R x S). ``direct`` keeps pixels in the broadcast dimension and output
    channels in vector lanes (plus converting the input to the blocked layout); ``gemm``
    the other way round (plus building the im2col panels). Depthwise convolutions have one
    input channel per output channel: vector lanes hold channels, and they are bound by
    memory traffic, not FMAs.
    """
    arch = constants(hw)
    n, groups, cg, fg, p, q, rs, depthwise = _conv_dims(op)
    if s.loop_order == "amx":
        return _estimate_tiles(op, s, hw)
    if depthwise and s.algorithm == "direct" and not s.pack_w:
        return _estimate_plane(op, s, hw)
    if s.algorithm == "winograd":
        return _estimate_winograd(op, s, hw)
    d = op.dims_dict
    lanes = hw.lanes
    T = s.threads
    peak = peak_gflops_per_core(hw) * 1e9
    direct = s.algorithm == "direct"
    pixels = p * q
    if depthwise:
        nv = max(1, s.oc_block // lanes)
        rows = s.ow_block * s.oh_block
        # Each FMA needs its own input vector: loads ~ FMAs, so at most half of peak.
        eff = micro_efficiency(rows, nv, arch, _margin(op, s)) * 0.5
        channels = round_up(d["C"], s.oc_block)
        flops = 2.0 * n * channels * round_up(q, s.ow_block) * round_up(p, s.oh_block) * rs
        units = n * (channels // s.oc_block if s.parallel == "oc" else p)
    elif direct:
        nv = max(1, s.oc_block // lanes)
        rows = s.ow_block * s.oh_block
        # The micro-kernel accumulates over every channel block before it stores its tile;
        # each block restarts its window loops.
        kc = cg * rs
        blocks = ceil_div(cg, min(s.ic_block, cg))
        eff = (micro_efficiency(rows, nv, arch, _margin(op, s), kc)
               * kc / (kc + 24 + _loop_steps(op, s, blocks)))
        if conv2d_blocks(op)[0]:
            eff *= _blocked_stream_factor(kc, rows, s.oc_block, nv, hw, arch)
        share, pixel_units = _direct_pixels(op, s)
        flops = 2.0 * n * groups * round_up(fg, s.oc_block) * pixels / share * cg * rs
        units = n * groups * (ceil_div(fg, s.oc_block) if s.parallel == "oc" else pixel_units)
    else:
        nv = max(1, s.ow_block // lanes)
        kc = min(s.ic_block, cg) * rs
        eff = micro_efficiency(s.oc_block, nv, arch, _margin(op, s)) * kc / (kc + 24)
        flops = (2.0 * n * groups * round_up(fg, s.oc_block) * round_up(pixels, s.ow_block)
                 * cg * rs)
        units = n * groups * (ceil_div(fg, s.oc_block) if s.parallel == "oc"
                              else ceil_div(pixels, s.ow_block))
    busy = min(T, max(1, units))
    balance = units / (ceil_div(units, busy) * busy) if units else 1.0
    compute_s = flops / (peak * eff * busy * balance) + _epilogue_s(op, hw, busy)
    in_elems = n * d["C"] * (d["H"] + d["pad_t"] + d["pad_b"]) * (d["W"] + d["pad_l"] + d["pad_r"])
    out_elems = n * d["F"] * pixels
    weights = d["F"] * cg * rs
    pack_s = _pack_s(op, s, hw, in_elems, busy)
    memory_s = pack_s + (8.0 * out_elems + 4.0 * weights) / (
        arch.bytes_per_cycle["l3"] * arch.ghz * 1e9 * busy)
    if depthwise:
        memory_s += 4.0 * in_elems / (arch.bytes_per_cycle["l3"] * arch.ghz * 1e9 * busy)
    elif direct:
        memory_s += _reread_s(op, s, hw, arch, busy, 4.0 * in_elems, 4.0 * weights)
    overhead_s = arch.call_overhead_s + (arch.fork_join_s if T > 1 else 0.0)
    seconds = compute_s + memory_s + overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, memory_s, overhead_s)


# Bytes per element a schedule's input copy moves. Weights are packed once, when a model is
# compiled (tuning times conv2d that way, codegen v2): per call they are only read, once.
# A direct schedule converts the whole input into a blocked copy (read and write) that its
# tiles then read back. A GEMM schedule copies one panel at a time into a buffer that stays
# in L1, so a 1x1 panel (a plain copy of input rows) costs the read; an im2col panel of a
# larger window is a gather, priced like the blocked copy. Over the seed's records this
# lifted the analytic top-1 on 1x1 convs from 0.67-0.78 to 0.70-0.89 per hardware spec
# (ARCHITECTURE change 54).
_COPY_BYTES = 8.0
_PANEL_1X1_BYTES = 4.0


def _pack_s(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec, in_elems: float,
            busy: int) -> float:
    """Seconds of the per-call input copy. A GEMM schedule split by output channels packs
    every panel in every thread (each walks all pixels), so that copy does not divide."""
    n, groups, cg, _, p, q, rs, _ = _conv_dims(op)
    if s.algorithm == "direct":
        # One channel per block makes the blocked copy a zero-padded copy of input rows.
        per = _PANEL_1X1_BYTES if min(s.ic_block, cg) == 1 else _COPY_BYTES
        nbytes, packers = per * in_elems, busy
    else:
        per = _PANEL_1X1_BYTES if rs == 1 else _COPY_BYTES
        nbytes = per * n * groups * cg * rs * p * q
        packers = 1 if s.parallel == "oc" else busy
    if conv2d_blocks(op)[0]:
        nbytes *= _blocked_input_copy(op)
    return nbytes / (constants(hw).pack_gbps * 1e9 * packers)


def _reread_s(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec, arch: ArchConstants,
              busy: int, in_bytes: float, w_bytes: float) -> float:
    """Seconds a direct convolution's loop order spends re-reading from L3: ``fp`` walks a
    thread's pixels once per output-channel block (its input share again each time when it
    outgrows half of L2), ``pf`` its weight share once per row block."""
    d = op.dims_dict
    ngf = d["groups"] * ceil_div(d["F"] // d["groups"], s.oc_block)
    npb = ceil_div(pixel_grid(op)[0], direct_tile(op, s)[0])
    if s.parallel == "oc":
        gf_per, pb_per, in_share, w_share = ceil_div(ngf, busy), npb, in_bytes, w_bytes / busy
    else:
        gf_per, pb_per, in_share, w_share = ngf, ceil_div(npb, busy), in_bytes / busy, w_bytes
    in_share *= _touched_share(op, hw)
    share, passes = (in_share, gf_per) if s.loop_order == "fp" else (w_share, pb_per)
    if share <= hw.l2_bytes * 0.5:
        return 0.0
    return share * (passes - 1) / (arch.bytes_per_cycle["l3"] * arch.ghz * 1e9)


def _touched_share(op: OpSignature, hw: HardwareSpec) -> float:
    """The share of the input's cache lines a pass over the output reads: a stride larger
    than the window skips rows (a 1x1 stride-2 layer reads half of them), and columns too
    where a pixel fills a cache line. On the AVX2 Zen 3 VM, ResNet-50's 1024->2048 1x1
    stride-2 layer ran 2x faster walking the input once per channel block (its touched half
    stays in L2) than walking the weights once per row block, which the whole input's bytes
    rated the other way round."""
    d = op.dims_dict
    rows = min(1.0, op.out_h * min(d["R"], d["stride_h"]) / d["H"])
    pixel_bytes = 4 * (conv2d_blocks(op)[0] or 1)
    cols = 1.0
    if pixel_bytes >= hw.cache_line:
        cols = min(1.0, op.out_w * min(d["S"], d["stride_w"]) / d["W"])
    return rows * cols


def _direct_pixels(op: OpSignature, s: Conv2dSchedule) -> tuple[float, int]:
    """A dense direct schedule's useful share of the pixels its tiles cover (edge tiles
    count whole) and the items a split by pixels divides: output rows, or the tiles of a
    flat pixel grid (:func:`flat_pixels`), which the kernel splits instead."""
    if flat_pixels(op):
        cols, width = pixel_grid(op)[1], direct_tile(op, s)[1]
        return cols / round_up(cols, width), ceil_div(cols, width)
    p, q = op.out_h, op.out_w
    return (q / round_up(q, s.ow_block)) * (p / round_up(p, s.oh_block)), p


def _epilogue_s(op: OpSignature, hw: HardwareSpec, busy: int) -> float:
    """Seconds of the epilogue's exp-based activation (``silu``), at the elementwise kind's
    instructions per vector; bias, add, relu and clip6 (one or two instructions per output
    vector) hide under the tile's stores."""
    heavy = sum(STEP_OPS.get(step, 0) for step in op.epilogue if STEP_OPS.get(step, 0) >= HEAVY)
    if not heavy:
        return 0.0
    arch = constants(hw)
    vectors = ceil_div(op.dim("N") * op.dim("F") * op.out_h * op.out_w, hw.lanes)
    return vectors * heavy / (arch.fma_pipes * arch.ghz * 1e9 * busy)


# What a direct tile on a blocked input sustains from L2 (bytes per cycle): measured on the
# AVX2 Zen 3 VM, a 512-channel 3x3 conv on 7x7 ran at 73 GFLOP/s with 14-pixel tiles of one
# weight vector and 31-39 with 4- or 7-pixel tiles, while the same tiles on NCHW input (one
# long channel block) ran within 10% of each other.
_BLOCKED_L2_BYTES_PER_CYCLE = 12.0


def _blocked_stream_factor(depth: int, rows: int, oc_block: int, nv: int, hw: HardwareSpec,
                           arch: ArchConstants) -> float:
    """The share of the FMA rate a direct tile keeps when its weight panel (``depth`` taps
    of ``oc_block`` channels) does not fit L1: every reduction step streams one weight row
    and one input value per pixel from L2, over ``rows * nv`` FMAs."""
    if depth * oc_block * 4 <= hw.l1d_bytes * 0.75:
        return 1.0
    need = (oc_block + rows) * 4 / (rows * nv / arch.fma_pipes)
    return min(1.0, _BLOCKED_L2_BYTES_PER_CYCLE / need)


def _blocked_input_copy(op: OpSignature) -> float:
    """The input copy of a blocked input relative to NCHW's transposition: none when it is
    read in place (no padding), row copies (memcpy, about a quarter) with a border."""
    d = op.dims_dict
    return 0.25 if any(d[k] for k in ("pad_t", "pad_l", "pad_b", "pad_r")) else 0.0


def _estimate_plane(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> Estimate:
    """The depthwise plane kernel: output columns in the lanes, one unaligned load per FMA
    (at most half of peak), tiles rounded up to whole vectors and rows; the input read once
    from memory and copied into an L2-resident plane (a strided copy when stride_w > 1)."""
    arch = constants(hw)
    d = op.dims_dict
    n, c, p, q, rs = d["N"], d["C"], op.out_h, op.out_w, d["R"] * d["S"]
    T = s.threads
    nv = max(1, s.ow_block // hw.lanes)
    acc = s.oh_block * nv
    eff = 0.5 * acc / (acc + 1)
    flops = 2.0 * n * c * round_up(q, s.ow_block) * round_up(p, s.oh_block) * rs
    units = n * c
    busy = min(T, max(1, units))
    balance = units / (ceil_div(units, busy) * busy)
    peak = peak_gflops_per_core(hw) * 1e9
    compute_s = flops / (peak * eff * busy * balance) + _epilogue_s(op, hw, busy)
    in_bytes = 4.0 * n * c * d["H"] * d["W"]
    out_bytes = 4.0 * n * c * p * q
    stream = arch.bytes_per_cycle["l3"] * arch.ghz * 1e9 * busy
    # The plane copy writes into L2: a memcpy per row at stride 1, an element-wise strided
    # copy otherwise (measured on Zen 4: the whole 96-channel 112x112 stride-2 layer runs at
    # about 25 GB/s of input).
    copy = in_bytes * (0.5 if d["stride_w"] == 1 else 1.0) / stream
    memory_s = (in_bytes + out_bytes) / stream + copy
    overhead_s = arch.call_overhead_s + (arch.fork_join_s if T > 1 else 0.0)
    seconds = compute_s + memory_s + overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, memory_s, overhead_s)


def _estimate_winograd(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> Estimate:
    """Winograd F(m x m, 3 x 3): ``a*a`` GEMMs of (tiles rounded up to the register tile's)
    x C x F at the micro-kernel's efficiency, the input and output transforms as vector
    operations, the V and M slabs through L2 (L3 when a chunk outgrows half of L2) and the
    transformed weights U (``(a/3)**2`` times the weights) streamed once per chunk of tiles:
    what makes small feature maps with many channels a loss for ``m=4``. NCHW tensors add
    their conversions to and from the blocked layout."""
    arch = constants(hw)
    d = op.dims_dict
    plan = winograd_plan(op, s)
    lanes, T = hw.lanes, s.threads
    cbx, cby = d["C"] // lanes, d["F"] // lanes
    t2 = plan.alpha * plan.alpha
    chunks = ceil_div(plan.tiles, plan.chunk)
    rows = (chunks - 1) * plan.chunk + round_up(plan.tiles - (chunks - 1) * plan.chunk,
                                                 s.ow_block)
    nv = s.oc_block // lanes
    cg = d["C"] // d["groups"]
    eff = micro_efficiency(s.ow_block, nv, arch, CONV_MARGIN) * cg / (cg + 24)
    units = t2 * d["groups"] * plan.nfb
    busy = min(T, units)
    peak = peak_gflops_per_core(hw) * 1e9
    gemm_s = 2.0 * t2 * rows * (d["C"] // d["groups"]) * plan.fp / (peak * eff * busy)
    in_ops, out_ops = transform_ops(plan.m)
    vector_ops = plan.tiles * (cbx * (in_ops + 2 * t2) + cby * (out_ops + t2 + plan.m ** 2))
    transform_s = vector_ops / (arch.fma_pipes * arch.ghz * 1e9 * min(T, plan.tiles))
    slab_bytes = 4.0 * (plan.v_floats + plan.m_floats)
    level = "l2" if slab_bytes <= hw.l2_bytes * 0.5 else "l3"
    cycle_bytes = arch.ghz * 1e9 * busy
    u_bytes = 4.0 * plan.u_floats * chunks
    u_level = "l2" if u_bytes <= hw.l2_bytes * 0.5 else "l3"
    memory_s = (2.0 * slab_bytes * chunks / (arch.bytes_per_cycle[level] * cycle_bytes)
                + u_bytes / (arch.bytes_per_cycle[u_level] * cycle_bytes))
    if not conv2d_blocks(op)[0]:
        # NCHW: the input transposed into the blocked copy, the output scattered lane by lane.
        in_elems, out_elems = d["N"] * d["C"] * d["H"] * d["W"], d["N"] * d["F"] * op.out_h * op.out_w
        memory_s += 8.0 * (in_elems + out_elems) / (arch.pack_gbps * 1e9 * min(T, plan.tiles))
    compute_s = gemm_s + transform_s + _epilogue_s(op, hw, busy)
    overhead_s = (arch.call_overhead_s + (arch.fork_join_s + 4 * chunks * arch.barrier_s
                                          if T > 1 else 0.0))
    seconds = compute_s + memory_s + overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, memory_s, overhead_s)


def _estimate_tiles(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> Estimate:
    """Estimate for ``loop_order=amx``: the busiest thread's output rows, each as tiles of
    ``ow_block`` pixels (a row narrower than a tile still takes a whole one) by
    ``oc_block`` channels, a product per C tile and a load per A and B tile for every
    channel block and tap; plus packing X, finishing each pixel and the call."""
    arch = constants(hw)
    d = op.dims_dict
    kc, ks = packed_channels(d["C"], d["S"], pixel_channels(op, s))
    steps = ceil_div(kc, pixel_channels(op, s)) * d["R"] * ks
    blocks = d["N"] * ceil_div(d["F"], s.oc_block)
    if tiles_plane(op):  # one plane of rows
        plane = op.out_h * plane_width(op)
        tiles = ceil_div(blocks * ceil_div(plane, s.ow_block), s.threads) * steps
    else:
        rows = ceil_div(blocks * op.out_h, s.threads)
        tiles = rows * ceil_div(op.out_w, s.ow_block) * steps
    mt, nt = s.ow_block // 16, s.oc_block // 16
    hz = arch.ghz * 1e9
    compute_s = tiles * (mt * nt * TILE_PRODUCT_CYCLES + (mt + nt) * TILE_LOAD_CYCLES) / hz
    outputs = d["N"] * d["F"] * op.out_h * op.out_w / s.threads
    finish_s = outputs / hw.lanes * FINISH_CYCLES_PER_VECTOR / hz
    pack_s = 4.0 * d["N"] * d["C"] * d["H"] * d["W"] / s.threads / (arch.pack_gbps * 1e9)
    overhead_s = arch.call_overhead_s + (arch.fork_join_s if s.threads > 1 else 0.0)
    seconds = compute_s + finish_s + pack_s + overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, finish_s + pack_s, overhead_s)


def _op_values(op: OpSignature) -> tuple[float, ...]:
    d = op.dims_dict
    g = d["groups"]
    # The implicit GEMM per image and group, in the same columns as matmul's dims.
    gemm = (l2(d["N"] * g), l2(d["F"] // g), l2(op.out_h * op.out_w),
            l2(d["C"] // g * d["R"] * d["S"]))
    return (
        *gemm,
        l2(d["N"]), l2(d["C"]), l2(d["H"]), l2(d["W"]), l2(d["F"]),
        d["R"], d["S"], l2(op.out_h), l2(op.out_w),
        d["stride_h"], d["stride_w"], d["pad_t"] + d["pad_b"], d["pad_l"] + d["pad_r"],
        d["dil_h"], d["dil_w"], l2(d["groups"]), float(is_depthwise(op)),
        *conv2d_blocks(op),
    )


def _knob_values(s: Conv2dSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    return (
        float(s.algorithm == "gemm"), s.oc_block, s.ow_block, s.oh_block, s.ic_block,
        l2(s.ic_block), float(s.loop_order == "pf"), s.unroll_kw, s.pack_w,
        *(float(s.parallel == axis) for axis in ("oc", "pixel")),
    )


def _cross(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    d = op.dims_dict
    lanes = hw.lanes
    T = s.threads
    g = d["groups"]
    P, Q = op.out_h, op.out_w
    cg = d["C"] // g
    dw = is_depthwise(op)
    direct = s.algorithm != "gemm"
    # Register tile: direct = (ow x oh) broadcast rows x oc vectors; gemm = oc rows x pixel
    # vectors. "m" is the broadcast direction, "n" the vector direction.
    if direct:
        rows, vec = s.ow_block * s.oh_block, s.oc_block
        width_n = d["C"] if dw else d["F"] // g
        eff_m = (Q / round_up(Q, s.ow_block)) * (P / round_up(P, s.oh_block))
        pixel_items = d["N"] * ceil_div(P, s.oh_block)
        if s.algorithm == "direct" and flat_pixels(op):
            eff_m, tiles = _direct_pixels(op, s)
            pixel_items = d["N"] * tiles
        eff_n = width_n / round_up(width_n, vec)
        oc_blocks = ceil_div(width_n, vec) * (1 if dw else g)
    else:
        rows, vec = s.oc_block, s.ow_block
        fg = d["F"] // g
        eff_m = fg / round_up(fg, rows)
        eff_n = (P * Q) / round_up(P * Q, vec)
        oc_blocks = ceil_div(fg, rows) * g
        pixel_items = d["N"] * g * ceil_div(P * Q, vec)
    nv = vec / lanes
    acc = rows * nv
    regs = acc + nv + 1
    icb = 1 if dw else min(s.ic_block, cg)
    items = oc_blocks if s.parallel == "oc" else pixel_items
    busiest = ceil_div(items, T)
    flops = float(op.flops)
    return (
        rows, nv, acc, regs, regs / hw.vector_registers, acc / (rows + nv),
        micro_efficiency(rows, int(nv), constants(hw), _margin(op, s)) if nv >= 1 else 0.0,
        eff_m, eff_n,
        items / (busiest * T) if T > 1 else 1.0, l2(items / T), l2(flops / T),
        cg / round_up(cg, icb) if not dw else 1.0,
        4.0 * s.oc_block * icb * d["R"] * d["S"] / hw.l1d_bytes,
        4.0 * icb * d["H"] * d["W"] / hw.l2_bytes,
    )


FEATURES = FeatureBlock(
    op_names=(
        "log_gemm_b", "log_gemm_m", "log_gemm_n", "log_gemm_k",
        "log_conv_n", "log_conv_c", "log_conv_h", "log_conv_w", "log_conv_f",
        "conv_r", "conv_s", "log_conv_p", "log_conv_q",
        "conv_stride_h", "conv_stride_w", "conv_pad_h", "conv_pad_w", "conv_dil_h", "conv_dil_w",
        "log_conv_groups", "conv_depthwise", "layout_in_block", "layout_out_block",
    ),
    op_values=_op_values,
    knob_names=("conv_algo_gemm", "oc_block", "ow_block", "oh_block", "ic_block", "log_ic_block",
                "conv_order_pf", "unroll_kw", "pack_w", "par_oc", "par_pixel"),
    knob_values=_knob_values,
    cross_names=(
        "tile_rows", "tile_vectors", "accumulators", "registers_used", "register_pressure",
        "fma_per_load", "micro_efficiency", "edge_eff_m", "edge_eff_n",
        "parallel_balance", "log_parallel_units", "log_flops_per_thread",
        "conv_ic_eff", "conv_fp_w_l1", "conv_fp_in_l2",
    ),
    cross_values=_cross,
)

KIND = register(CostKind(name="conv2d", estimate=estimate_conv2d, features=FEATURES))
