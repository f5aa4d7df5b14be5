"""The tuner's side of ``conv2d``: direct (pixels x channel vectors), implicit-GEMM
(channels x pixel vectors) and depthwise-plane register tiles, channel blocks sized so a
block's weights stay in L1/L2, and refinement moves."""

from __future__ import annotations

from collections.abc import Iterator

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.conv2d.emit import reduces_in_chunks
from tunecache.compiler.kinds.conv2d.lowp import runs_float_kernel, tile_pixel_channels
from tunecache.compiler.kinds.conv2d.space import (
    MAX_OW_BLOCK,
    WINOGRAD_TILES,
    Conv2dSchedule,
    conv2d_blocks,
    flat_pixels,
    is_depthwise,
    local_axis,
    pixel_grid,
    winograd_shape,
)
from tunecache.compiler.kinds.matmul import tile_dtypes
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import MAX_MR, problems
from tunecache.costmodel.analytic import round_up
from tunecache.tuner.kinds import Strata, TunerKind, balanced, register, threads_axes
from tunecache.tuner.kinds.matmul import TILE_SHAPES


def _conv_pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[Conv2dSchedule]:
    """Conv2d candidates: direct register tiles (pixels x one to four channel vectors) and,
    unless depthwise, implicit-GEMM tiles (channels x pixel vectors), with channel blocks
    sized so a block's weights stay in L1/L2 and reduction depths like matmul's kc. Blocked
    layouts take direct tiles only, channel blocks of the input's block.

    Three- and four-vector direct tiles (4 and 2 pixels at AVX2) measured fastest on
    several of ResNet-50's blocked 1x1 layers on the AVX2 Zen 3 VM: the 1024->2048 stride-2
    one ran 3.2 ms with 3 vectors x 4 pixels against 3.9-4.0 ms with one or two vectors."""
    yield from _tile_pool(op, hw, threads)
    d = op.dims_dict
    xi, xo = conv2d_blocks(op)
    lanes, regs = hw.lanes, hw.vector_registers
    groups = d["groups"]
    cg, fg = d["C"] // groups, d["F"] // groups
    p, q = pixel_grid(op)
    rs = d["R"] * d["S"]
    depthwise = is_depthwise(op)
    width = d["C"] if depthwise else fg
    pars = _direct_axes(op, threads)
    for nv in (1, 2, 3, 4):
        if nv > 1 and width <= (nv - 1) * lanes:
            break
        if depthwise and xi > 16 and nv * lanes < xi:
            continue  # part of a tile-row block: 0.26 against 0.17 ms whole (a 3x3, 112x112)
        max_rows = min(MAX_OW_BLOCK, (regs - nv - 1) // nv)
        ows = {min(q, max_rows), balanced(q, max_rows, 1), balanced(q, max(1, max_rows // 2), 1)}
        for ow in sorted(ows):
            for oh in (1, 2, 4):
                if ow * oh > max_rows or (oh > 1 and (oh > p or q > max_rows // 2)):
                    continue
                ics = ([1] if depthwise else [xi] if xi else _channel_blocks(cg, lanes))
                for ic in ics:
                    for order in ("fp", "pf"):
                        for unroll in ((0, 1) if d["S"] > 1 else (0,)):
                            for par in pars:
                                yield Conv2dSchedule(
                                    oc_block=nv * lanes, ow_block=ow, oh_block=oh, ic_block=ic,
                                    algorithm="direct", loop_order=order, unroll_kw=unroll,
                                    threads=threads, parallel=par)
    yield from _winograd_pool(op, hw, threads)
    if xi or xo:
        return
    if depthwise:
        # The plane kernel: output columns in the lanes, rows of the tile in registers
        # beside the R weights of one kernel column and the input vector the sweep shares.
        for nv in (1, 2, 4):
            if nv > 1 and (nv - 1) * lanes >= q:
                break
            for oh in (1, 2, 4, 8):
                if oh * nv + d["R"] + 1 > regs or (oh > 1 and oh > p):
                    continue
                for unroll in ((0, 1) if d["S"] > 1 else (0,)):
                    yield Conv2dSchedule(oc_block=lanes, ow_block=nv * lanes, oh_block=oh,
                                         ic_block=1, pack_w=0, unroll_kw=unroll,
                                         threads=threads, parallel="oc")
        return
    for nv in (1, 2, 3, 4):
        max_mr = min(MAX_MR, (regs - nv - 1) // nv)
        for mr in sorted({max_mr, max(1, max_mr // 2), min(max_mr, round_up(min(fg, 8), 1))}):
            for depth in (256, 512):
                ic = max(1, min(cg, depth // rs))
                for pack_w in (1, 0):
                    for par in threads_axes(threads, ("oc", "pixel")):
                        yield Conv2dSchedule(
                            oc_block=mr, ow_block=nv * lanes, ic_block=ic, algorithm="gemm",
                            pack_w=pack_w, threads=threads, parallel=par)


def _tile_pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[Conv2dSchedule]:
    """Matrix-tile (AMX) schedules of an int8 or bf16 conv2d where ``hw`` has the tiles:
    pixels x channels in whole tiles (:data:`TILE_SHAPES`), a tile row of channels a packed
    pixel block (or half of one: ``tile_pixel_channels``). None for a bf16 depthwise conv2d
    (the float32 kernel runs it)."""
    if op.dtype not in tile_dtypes(hw) or runs_float_kernel(op):
        return
    for ow, oc in TILE_SHAPES:
        yield Conv2dSchedule(oc_block=oc, ow_block=ow, ic_block=tile_pixel_channels(op),
                             loop_order="amx", threads=threads)


def _direct_axes(op: OpSignature, threads: int) -> list[str]:
    """The thread splits direct tiles of ``op`` are tuned with: the one a model runs
    (``space.local_axis``) where that rule applies, else every one worth trying."""
    axis = local_axis(op, threads)
    return [axis] if axis else threads_axes(threads, ("oc", "pixel"))


def _channel_blocks(cg: int, lanes: int) -> list[int]:
    """Input-channel blocks of a direct tile on NCHW input: a vector's worth and L1/L2-sized
    depths, and one channel per block where the input has fewer channels than lanes (a stem:
    its copy is then a row copy, not an interleave). On the AVX2 Zen 3 VM, MobileNet-v2's
    3x3 stem (3 channels) ran 0.29-0.31 ms with one channel per block against 0.35-0.37 ms
    with all three interleaved, same tile."""
    blocks = {min(cg, b) for b in (lanes, 64, 256)}
    if cg < lanes:
        blocks.add(1)
    return sorted(blocks)


def _winograd_pool(op: OpSignature, hw: HardwareSpec,
                   threads: int) -> Iterator[Conv2dSchedule]:
    """Winograd tiles for 3x3 stride-1 convolutions (not depthwise), blocked or NCHW: both
    output tiles m, one, two or four channel vectors (four only where the layer has the
    channels), register tiles of as many Winograd tiles as the registers allow and of half as
    many (balanced over the tiles, so a small map is not padded to a tall tile). Layouts and
    channel counts the kernel cannot take yield nothing.

    Four vectors make short tiles (3-6 Winograd tiles on AVX-512): measured on Zen 4, they
    ran ResNet-50's 64-channel 56x56 layer 12-15% faster at one thread and 13-38% faster at
    two than the tall one- and two-vector tiles (0.657 against 0.74-0.77 ms; 0.355 against
    0.41-0.57 ms)."""
    d = op.dims_dict
    if not winograd_shape(op):
        return
    regs, lanes = hw.vector_registers, hw.lanes
    block = conv2d_blocks(op)[0] or lanes
    probe = Conv2dSchedule(oc_block=lanes, ow_block=1, oh_block=WINOGRAD_TILES[0],
                           ic_block=block, algorithm="winograd", threads=threads)
    if problems(op, probe, hw):
        return
    fg = d["F"] // d["groups"]
    for m in WINOGRAD_TILES:
        tiles = d["N"] * -(-op.out_h // m) * -(-op.out_w // m)
        for nv in (1, 2, 4):
            max_rows = (regs - nv - 1) // nv
            if nv > 1 and (nv // 2) * lanes >= fg:
                break
            for nt in sorted({min(max_rows, tiles), balanced(tiles, max_rows, 1),
                              balanced(tiles, max(1, max_rows // 2), 1)}):
                yield Conv2dSchedule(oc_block=nv * lanes, ow_block=nt, oh_block=m,
                                     ic_block=block, algorithm="winograd", threads=threads)


def _tile_key(s: Conv2dSchedule) -> tuple[object, ...]:
    plane = s.algorithm == "direct" and not s.pack_w
    name = "amx" if s.loop_order == "amx" else "plane" if plane else s.algorithm
    return (name, s.oc_block, s.ow_block, s.oh_block)


def _grid(op: OpSignature, hw: HardwareSpec, threads: int | None) -> Strata:
    """Both algorithms, every legal register tile on a grid of widths, channel blocks, loop
    orders, kernel-width unrolling, weight packing and parallel axes, grouped by tile."""
    threads = hw.cores if threads is None else max(1, min(threads, hw.cores))
    d = op.dims_dict
    lanes, regs = hw.lanes, hw.vector_registers
    cg = d["C"] // d["groups"]
    rs = d["R"] * d["S"]
    xi, _ = conv2d_blocks(op)
    pars = threads_axes(threads, ("oc", "pixel"))
    strata: Strata = {}

    def add(s: Conv2dSchedule) -> None:
        if not problems(op, s, hw):
            strata.setdefault(_tile_key(s), []).append(s)

    for tiled in _tile_pool(op, hw, threads):
        add(tiled)
    # On a flat pixel grid a tile is oh x ow pixels in a row: one row per tile, any width.
    flat = flat_pixels(op)
    widths = set(range(1, MAX_OW_BLOCK + 1)) if flat else {1, 2, 4, 7, 8, 12, 14, 16, 28}
    for nv in range(1, 5):
        max_rows = min(MAX_OW_BLOCK, (regs - nv - 1) // nv)
        for ow in sorted((widths | {max_rows}) & set(range(1, max_rows + 1))):
            for oh in (1,) if flat else (1, 2, 4):
                if ow * oh > max_rows:
                    continue
                ics = [xi] if xi else sorted({1, lanes, 32, 64, 128, cg} & set(range(1, cg + 1)))
                for ic in ics:
                    for order in ("fp", "pf"):
                        for unroll in (0, 1):
                            for par in _direct_axes(op, threads):
                                add(Conv2dSchedule(oc_block=nv * lanes, ow_block=ow, oh_block=oh,
                                                   ic_block=ic, algorithm="direct",
                                                   loop_order=order, unroll_kw=unroll,
                                                   threads=threads, parallel=par))
    for m in WINOGRAD_TILES if winograd_shape(op) else ():
        for nv in range(1, 5):
            for nt in range(1, MAX_OW_BLOCK + 1):
                add(Conv2dSchedule(oc_block=nv * lanes, ow_block=nt, oh_block=m,
                                   ic_block=xi or lanes, algorithm="winograd", threads=threads))
    if is_depthwise(op):
        for nv in range(1, 5):
            for oh in (1, 2, 3, 4, 6, 8):
                for unroll in (0, 1):
                    add(Conv2dSchedule(oc_block=lanes, ow_block=nv * lanes, oh_block=oh,
                                       ic_block=1, pack_w=0, unroll_kw=unroll, threads=threads,
                                       parallel="oc"))
    if not is_depthwise(op):
        for nv in range(1, 5):
            max_mr = min(MAX_MR, (regs - nv - 1) // nv)
            for mr in sorted({1, 2, 4, 6, 8, 12, 14, 16, 24, max_mr} & set(range(1, max_mr + 1))):
                for depth in (64, 128, 256, 512, 1024):
                    for pack_w in (1, 0):
                        for par in pars:
                            add(Conv2dSchedule(oc_block=mr, ow_block=nv * lanes,
                                               ic_block=max(1, min(cg, depth // rs)),
                                               algorithm="gemm", pack_w=pack_w, threads=threads,
                                               parallel=par))
    return {k: list(dict.fromkeys(v)) for k, v in strata.items()}


def _neighbours(op: OpSignature, best: Conv2dSchedule, hw: HardwareSpec) -> list[Conv2dSchedule]:
    """Channel block x/÷ 2, the other loop order, one row more or less per tile (one pixel
    on a flat pixel grid), the other kernel-width unrolling and weight packing, the other
    parallel axis."""
    out = [best.replace(ic_block=max(1, best.ic_block * 2)),
           best.replace(ic_block=max(1, best.ic_block // 2)),
           best.replace(loop_order="pf" if best.loop_order == "fp" else "fp"),
           best.replace(oh_block=best.oh_block + 1),
           best.replace(oh_block=max(1, best.oh_block - 1)),
           best.replace(unroll_kw=1 - best.unroll_kw)]
    if best.algorithm == "gemm":
        out.append(best.replace(pack_w=1 - best.pack_w))
    if best.algorithm == "winograd":
        out += [best.replace(oh_block=m) for m in WINOGRAD_TILES]
    if best.algorithm == "winograd" or (best.algorithm == "direct" and flat_pixels(op)):
        out += [best.replace(ow_block=best.ow_block + 1),
                best.replace(ow_block=max(1, best.ow_block - 1))]
    if best.threads > 1 and not (best.algorithm == "direct" and local_axis(op, best.threads)):
        out.append(best.replace(parallel="pixel" if best.parallel == "oc" else "oc"))
    return out


WIDE_VECTORS = 4
"""Channel vectors of the wide-tile challenger (:func:`_challengers`)."""


def _challengers(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> list[Conv2dSchedule]:
    """For a dense layer on a blocked input, the tile of four channel vectors and as many
    pixels as the registers hold (6 at AVX-512; in a row of the image unless the layer is a
    flat 1x1), where its kernel reduces in L1-sized chunks (``emit.reduces_in_chunks``) and
    ``s`` is another tile.

    Four weight vectors and six broadcasts feed its 24 FMAs a step, against 29 loads for 28
    FMAs in a one-vector tile of 28 pixels. The estimate charges such wide tiles for
    streaming their weights from L2 and ranks them low; chunked, they stream none. On the
    AVX-512 Xeon VM (weights cold, one process) ResNet-50's 512-channel 1x1 layers at
    28x28 ran it in 0.77-0.84x the time of a 16-channel x 30-pixel tile, the 1024-to-512
    layer at 14x14 in 0.91-0.97x, the 1024-to-256 one 0.98x and the 256-to-1024 one 1.04x
    (ARCHITECTURE change 77). Its 3x3 layers ran it in 0.87-0.93x the time of the seed's
    schedules at stride 2, 1.02x at 14x14 stride 1. At 16 registers a four-vector tile
    holds two pixels and waits on FMA latency, so there is none."""
    lanes = hw.lanes
    # Below 32 registers no kernel chunks (direct_plan.CHUNK_MIN_REGISTERS): reduces_in_chunks says no.
    if (s.algorithm != "direct" or is_depthwise(op) or not conv2d_blocks(op)[0]
            or op.dim("F") < WIDE_VECTORS * lanes):
        return []
    rows = (hw.vector_registers - WIDE_VECTORS - 1) // WIDE_VECTORS
    wide = s.replace(oc_block=WIDE_VECTORS * lanes, ow_block=rows, oh_block=1)
    if not flat_pixels(op):
        # A row of the window's image; the channel blocks' weights once per image (fp), and
        # the kernel-width loop unrolled, as measured.
        wide = wide.replace(ow_block=min(rows, op.out_w), loop_order="fp",
                            unroll_kw=int(op.dim("S") > 1))
    if wide == s or not reduces_in_chunks(op, wide, hw.isa):
        return []
    return [wide]


def _algorithm(s: Conv2dSchedule) -> str:
    return "amx" if s.loop_order == "amx" else s.algorithm


KIND = register(TunerKind(name="conv2d", pool=_conv_pool, tile_key=_tile_key, grid=_grid,
                          neighbours=_neighbours, algorithm=_algorithm,
                          challengers=_challengers, unseen=lambda s: s.loop_order == "amx"))
