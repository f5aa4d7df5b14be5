"""The conv2d schedule family: knobs, legal space, default (see docs/CONV2D.md).

Knobs of :class:`Conv2dSchedule`:

* ``algorithm``: ``direct`` (blocked direct convolution over an NCHW[x]c copy of the input,
  output channels in vector lanes; depthwise convolutions vectorise over channels instead)
  or ``gemm`` (implicit GEMM: weights are the A operand, the im2col matrix is built panel by
  panel at pack time, output pixels in vector lanes, NCHW output written directly)
  or ``winograd`` (F(m x m, 3 x 3) for dense 3x3 stride-1 convolutions on one blocked
  layout, ``winograd.py``: ``oh_block`` is the output tile m (2 or 4), ``ow_block`` the
  Winograd tiles of a register tile, ``oc_block`` its output channels, ``ic_block`` the
  layout's block; the other knobs keep their defaults).
* ``oc_block``: output channels per register tile — a multiple of the lanes for ``direct``,
  the broadcast rows (like matmul ``mr``) for ``gemm``.
* ``ow_block``: output pixels per register tile — columns of one output row for ``direct``,
  a multiple of the lanes of flattened output pixels for ``gemm``.
* ``oh_block``: output rows per register tile (``direct``; 1 for ``gemm``).
* ``ic_block``: input channels per block — the channel block of the NCHW[x]c layout for
  ``direct``; the reduction (cache) block, ``ic_block*R*S`` rows of the im2col panel, for
  ``gemm``. A block larger than the group's channels simply covers them.
* ``loop_order``: ``fp`` (output-channel blocks outer: a weight block stays hot across
  pixels) or ``pf`` (output rows outer: input rows stay hot across channel blocks).
* ``unroll_kw``: fully unroll the kernel-width loop (``direct`` only).
* ``pack_w``: repack the weights into ``oc_block``-row panels each call (1), or read full
  panels in place from ``W[F, C/groups*R*S]`` (0, ``gemm``; pays off when there are few
  pixel panels, e.g. 7x7 feature maps, where repacking costs as much as the convolution).
  ``direct`` with ``pack_w=0`` is the *plane* kernel for depthwise convolutions: no NCHW[x]c
  copy; each channel's zero-padded input plane (split into stride phases) sits in a small
  per-thread buffer and output columns fill the vector lanes — ``ow_block`` is then a
  multiple of the lanes, ``oh_block`` rows make the register tile, ``oc_block`` is ignored
  and threads split channels (``parallel="oc"``).
* ``threads`` and ``parallel``: OpenMP threads and what they split: ``oc`` (output-channel
  blocks) or ``pixel`` (output rows for ``direct``, pixel panels for ``gemm``).

Blocked layouts (``layout``/``out_layout`` ``nchw{x}c``) run on ``direct`` (not the plane
kernel) and ``winograd``, not on ``gemm``: a blocked input fixes ``ic_block`` to its block ``x``; a depthwise
tile covers part of one block (``oc_block`` divides ``x``), a dense one whole blocks or part
of one (``oc_block`` a multiple or a divisor of ``x``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tunecache.compiler.codegen.epilogue import chain_rows
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.layouts import channel_block, layout_problems
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import (
    MAX_BLOCK,
    MAX_MR,
    MAX_NR_VECTORS,
    MAX_PACKED_BYTES,
    ScheduleData,
    threads_problem,
)

CONV_ALGORITHMS = ("direct", "gemm", "winograd")
WINOGRAD_TILES = (2, 4)
"""The output tile sizes ``m`` of F(m x m, 3 x 3) that ``algorithm=winograd`` generates."""
CONV_LOOP_ORDERS = ("fp", "pf")
CONV_PARALLEL_AXES = ("oc", "pixel")
MAX_OW_BLOCK = 32
MAX_OH_BLOCK = 8
MAX_IC_BLOCK = 1024


@dataclass(frozen=True, slots=True)
class Conv2dSchedule(ScheduleData):
    """Knobs of a conv2d kernel (see the module docstring and docs/CONV2D.md)."""

    family: ClassVar[str] = "conv2d"

    oc_block: int
    ow_block: int
    ic_block: int
    oh_block: int = 1
    algorithm: str = "direct"
    loop_order: str = "fp"
    unroll_kw: int = 0
    pack_w: int = 1
    threads: int = 1
    parallel: str = "oc"

    def __str__(self) -> str:
        return (
            f"{self.algorithm} oc{self.oc_block} ow{self.ow_block}xoh{self.oh_block} "
            f"ic{self.ic_block} {self.loop_order} kw{self.unroll_kw} pw{self.pack_w} "
            f"t{self.threads}{self.parallel}"
        )


def is_depthwise(op: OpSignature) -> bool:
    """One input and one output channel per group (MobileNet's depthwise convolutions)."""
    d = op.dims_dict
    return d["C"] == d["groups"] and d["F"] == d["groups"]


def flat_pixels(op: OpSignature) -> bool:
    """A dense 1x1 convolution of stride 1 without padding: its output pixels are its input
    pixels, and in every layout (each channel's plane of NCHW, each block's of NCHW[x]c) an
    image's ``P*Q`` pixels are one run in memory. A ``direct`` tile then takes ``oh_block *
    ow_block`` consecutive pixels of that run rather than ``oh_block`` rows of ``ow_block``
    columns, so a row's width leaves no narrow tile at its end (a 7x7 map in 4-pixel tiles ran
    a 3-pixel tile in every row; ARCHITECTURE change 65)."""
    d = op.dims_dict
    return (d["R"] == d["S"] == d["stride_h"] == d["stride_w"] == 1
            and not any(d[k] for k in ("pad_t", "pad_l", "pad_b", "pad_r"))
            and not is_depthwise(op))


def pixel_grid(op: OpSignature) -> tuple[int, int]:
    """(rows, columns) of the grid a ``direct`` tile's pixels are laid over: ``(1, P*Q)`` for
    :func:`flat_pixels`, else the output's ``(P, Q)``."""
    if flat_pixels(op):
        return 1, op.out_h * op.out_w
    return op.out_h, op.out_w


def direct_tile(op: OpSignature, s: Conv2dSchedule) -> tuple[int, int]:
    """(rows, columns) of a ``direct`` register tile on :func:`pixel_grid`, clipped to it: on a
    flat grid one row of ``oh_block * ow_block`` pixels (the same registers as the 2-D tile)."""
    rows, cols = pixel_grid(op)
    if flat_pixels(op):
        return 1, min(s.oh_block * s.ow_block, cols)
    return min(s.oh_block, rows), min(s.ow_block, cols)


def conv2d_blocks(op: OpSignature) -> tuple[int, int]:
    """Channel blocks of X and Y: ``x`` of a blocked ``nchw{x}c`` layout, 0 for ``nchw``."""
    return channel_block(op.attr("layout")), channel_block(op.attr("out_layout"))


def _blocked_problems(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> list[str]:
    """What blocked layouts ask of a schedule (empty for ``nchw`` in and out)."""
    xi, xo = conv2d_blocks(op)
    if not (xi or xo):
        return []
    found = layout_problems((op.attr("layout"), op.attr("out_layout")), hw)
    what = f"layout={op.attr('layout')}, out_layout={op.attr('out_layout')}"
    if s.algorithm != "direct":
        found.append(f"algorithm={s.algorithm} reads and writes nchw only; use direct for "
                     f"{what}")
    elif not s.pack_w and is_depthwise(op):
        found.append(f"the depthwise plane kernel (pack_w=0) reads and writes nchw planes; "
                     f"use pack_w=1 for {what}")
    x = max(xi, xo)
    if s.oc_block < 1:
        return found
    if is_depthwise(op):
        if x % s.oc_block:
            found.append(f"oc_block={s.oc_block} must divide the {x}-channel blocks of {what} "
                         "(a depthwise tile reads and writes part of one block)")
    else:
        if xi and s.ic_block != xi:
            found.append(f"ic_block={s.ic_block} must be {xi}, the channel block of "
                         f"layout={op.attr('layout')} (the input is read in place)")
        if xo and s.oc_block % xo and xo % s.oc_block:
            found.append(f"oc_block={s.oc_block} must be a multiple or a divisor of the "
                         f"{xo}-channel blocks of out_layout={op.attr('out_layout')}")
    return found


def conv2d_problems(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``s`` is illegal for the conv2d ``op`` on ``hw`` (empty when legal)."""
    found: list[str] = []
    lanes = hw.lanes
    direct = s.algorithm == "direct"
    if s.algorithm not in CONV_ALGORITHMS:
        found.append(f"algorithm={s.algorithm!r}; expected one of {', '.join(CONV_ALGORITHMS)}")
        return found
    if s.algorithm == "winograd":
        return _winograd_problems(op, s, hw)
    if (chain_rows(op.epilogue) or op.attr("narrow") != "none") and \
            not (direct and s.pack_w == 1):
        found.append("an element-wise chain or a narrow activation needs the direct "
                     "kernel: algorithm=direct with pack_w=1")
    blocked = _blocked_problems(op, s, hw)
    if direct and s.pack_w == 0 and is_depthwise(op):
        return found + _plane_problems(op, s, hw) + blocked
    found += blocked
    # The vector dimension is output channels for direct, output pixels for gemm.
    vec_knob, vec_value = ("oc_block", s.oc_block) if direct else ("ow_block", s.ow_block)
    bcast_knob, bcast_value, bcast_max = (
        ("ow_block", s.ow_block, MAX_OW_BLOCK) if direct else ("oc_block", s.oc_block, MAX_MR)
    )
    nv = 0
    if vec_value < 1 or vec_value % lanes:
        found.append(f"{vec_knob}={vec_value} must be a positive multiple of {lanes} "
                     f"({hw.isa} lanes) for algorithm={s.algorithm}")
    elif vec_value // lanes > MAX_NR_VECTORS:
        found.append(f"{vec_knob}={vec_value} exceeds {MAX_NR_VECTORS} vectors of {lanes} lanes")
    else:
        nv = vec_value // lanes
    if not 1 <= bcast_value <= bcast_max:
        found.append(f"{bcast_knob}={bcast_value} out of range 1..{bcast_max}")
    if not 1 <= s.oh_block <= MAX_OH_BLOCK:
        found.append(f"oh_block={s.oh_block} out of range 1..{MAX_OH_BLOCK}")
    elif not direct and s.oh_block != 1:
        found.append("oh_block must be 1 for algorithm=gemm (its tiles are flattened pixels)")
    if nv and 1 <= bcast_value <= bcast_max and 1 <= s.oh_block <= MAX_OH_BLOCK:
        rows = bcast_value * (s.oh_block if direct else 1)
        needed = rows * nv + nv + 1
        if needed > hw.vector_registers:
            found.append(
                f"register tile needs {needed} vector registers ({rows * nv} accumulators + "
                f"{nv} loaded vectors + 1 broadcast); {hw.isa} has {hw.vector_registers}"
            )
    if not 1 <= s.ic_block <= MAX_IC_BLOCK:
        found.append(f"ic_block={s.ic_block} out of range 1..{MAX_IC_BLOCK}")
    if s.loop_order not in CONV_LOOP_ORDERS:
        found.append(f"loop_order={s.loop_order!r}; expected one of {', '.join(CONV_LOOP_ORDERS)}")
    if s.pack_w not in (0, 1):
        found.append(f"pack_w={s.pack_w} must be 0 or 1")
    elif direct and not s.pack_w:
        found.append("pack_w=0 with algorithm=direct is the plane kernel of depthwise "
                     "convolutions only (other direct convolutions need blocked weights)")
    if s.unroll_kw not in (0, 1):
        found.append(f"unroll_kw={s.unroll_kw} must be 0 or 1")
    elif not direct and s.unroll_kw:
        found.append("unroll_kw applies to algorithm=direct only; use 0 for gemm")
    found += threads_problem(s.threads, hw)
    if s.parallel not in CONV_PARALLEL_AXES:
        found.append(f"parallel={s.parallel!r}; expected one of {', '.join(CONV_PARALLEL_AXES)}")
    if not direct and is_depthwise(op):
        found.append("algorithm=gemm does not apply to depthwise convolutions (one channel "
                     "per group leaves nothing to multiply as a matrix); use direct")
    if not found:
        d = op.dims_dict
        cg = d["C"] // d["groups"]
        icb = min(s.ic_block, cg)
        if direct:
            channels = d["C"] if is_depthwise(op) else d["groups"] * -(-cg // icb) * icb
            padded = (d["N"] * channels * (d["H"] + d["pad_t"] + d["pad_b"])
                      * (d["W"] + d["pad_l"] + d["pad_r"]))
        else:
            padded = s.threads * icb * d["R"] * d["S"] * s.ow_block
        weights = d["F"] * (-(-cg // icb) * icb) * d["R"] * d["S"] * 2
        if 4 * (padded + weights) > MAX_PACKED_BYTES:
            found.append(
                f"packed buffers would take {4 * (padded + weights) >> 20} MiB "
                f"(> {MAX_PACKED_BYTES >> 20} MiB)"
            )
    return found


def winograd_shape(op: OpSignature) -> bool:
    """A 3x3 convolution of stride 1 and dilation 1 that is not depthwise: the shapes
    ``algorithm=winograd`` computes (layouts and channel counts aside)."""
    d = op.dims_dict
    shape = (d["R"], d["S"], d["stride_h"], d["stride_w"], d["dil_h"], d["dil_w"])
    return shape == (3, 3, 1, 1, 1, 1) and not is_depthwise(op)


def _winograd_problems(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> list[str]:
    """Legality of ``algorithm=winograd`` (``winograd.py``): :func:`winograd_shape` on
    whole-vector blocked layouts; ``oh_block`` is the output tile m, ``ow_block`` the tiles of
    a register tile."""
    d = op.dims_dict
    found: list[str] = []
    if not winograd_shape(op):
        found.append("algorithm=winograd computes 3x3 convolutions of stride 1 and dilation 1 "
                     "that are not depthwise only; use direct")
    xi, xo = conv2d_blocks(op)
    lanes = hw.lanes
    g = d["groups"]
    x = xi or lanes
    if xi != xo or x % lanes or (d["C"] // g) % x or (d["F"] // g) % x:
        found.append("algorithm=winograd reads and writes nchw, or one blocked layout "
                     f"nchw{{x}}c of whole {hw.isa} vectors, with each group's C and F "
                     f"multiples of x ({lanes} for nchw); got layout={op.attr('layout')}, "
                     f"out_layout={op.attr('out_layout')}, C={d['C']}, F={d['F']}, groups={g}")
    found += layout_problems((op.attr("layout"), op.attr("out_layout")), hw)
    if s.oh_block not in WINOGRAD_TILES:
        found.append(f"oh_block={s.oh_block} is the output tile m of F(m x m, 3 x 3); "
                     f"expected one of {', '.join(map(str, WINOGRAD_TILES))}")
    if s.oc_block < lanes or s.oc_block % lanes or s.oc_block // lanes > MAX_NR_VECTORS:
        found.append(f"oc_block={s.oc_block} must be 1..{MAX_NR_VECTORS} vectors of {lanes} "
                     "lanes")
    elif not 1 <= s.ow_block <= MAX_OW_BLOCK:
        found.append(f"ow_block={s.ow_block} (tiles per register tile) out of range "
                     f"1..{MAX_OW_BLOCK}")
    else:
        nv = s.oc_block // lanes
        needed = s.ow_block * nv + nv + 1
        if needed > hw.vector_registers:
            found.append(f"register tile needs {needed} vector registers ({s.ow_block * nv} "
                         f"accumulators + {nv} loaded vectors + 1 broadcast); {hw.isa} has "
                         f"{hw.vector_registers}")
    if s.ic_block != x:
        found.append(f"ic_block={s.ic_block} must be {x}, the channel block of the input"
                     + ("" if xi else f" (nchw is blocked by {hw.isa}'s {lanes} lanes)"))
    defaults = {"loop_order": "fp", "unroll_kw": 0, "pack_w": 1, "parallel": "oc"}
    for knob, value in defaults.items():
        if getattr(s, knob) != value:
            found.append(f"{knob}={getattr(s, knob)!r} does not apply to algorithm=winograd; "
                         f"use {value!r}")
    found += threads_problem(s.threads, hw)
    return found


def plane_buffer_floats(op: OpSignature, s: Conv2dSchedule) -> tuple[int, int, int]:
    """(rows, row width, floats) of one thread's plane buffer for the depthwise plane kernel:
    the zero-padded input plane split into ``stride_w`` column phases, with slack rows and
    columns so a tile never reads outside it."""
    d = op.dims_dict
    sh, sw = d["stride_h"], d["stride_w"]
    tiles_h = -(-op.out_h // s.oh_block)
    rows = max(d["H"] + d["pad_t"] + d["pad_b"],
               (tiles_h * s.oh_block - 1) * sh + (d["R"] - 1) * d["dil_h"] + 1)
    tiles_w = -(-op.out_w // s.ow_block)
    width = max(-(-(d["W"] + d["pad_l"] + d["pad_r"]) // sw),
                tiles_w * s.ow_block + ((d["S"] - 1) * d["dil_w"]) // sw)
    width = -(-width // 16) * 16
    return rows, width, sw * rows * width


def _plane_problems(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> list[str]:
    """Legality of the depthwise plane kernel (``direct`` with ``pack_w=0``)."""
    found: list[str] = []
    lanes = hw.lanes
    what = "the depthwise plane kernel (direct, pack_w=0)"
    nv = 0
    if s.ow_block < 1 or s.ow_block % lanes:
        found.append(f"ow_block={s.ow_block} must be a positive multiple of {lanes} "
                     f"({hw.isa} lanes) for {what}")
    elif s.ow_block // lanes > MAX_NR_VECTORS:
        found.append(f"ow_block={s.ow_block} exceeds {MAX_NR_VECTORS} vectors of {lanes} lanes")
    else:
        nv = s.ow_block // lanes
    if not 1 <= s.oh_block <= MAX_OH_BLOCK:
        found.append(f"oh_block={s.oh_block} out of range 1..{MAX_OH_BLOCK}")
    elif nv and s.oh_block * nv + 2 > hw.vector_registers:
        found.append(f"register tile needs {s.oh_block * nv + 2} vector registers "
                     f"({s.oh_block * nv} accumulators + 1 loaded + 1 weight); {hw.isa} has "
                     f"{hw.vector_registers}")
    if not 1 <= s.oc_block <= MAX_BLOCK:
        found.append(f"oc_block={s.oc_block} out of range 1..{MAX_BLOCK}")
    if not 1 <= s.ic_block <= MAX_IC_BLOCK:
        found.append(f"ic_block={s.ic_block} out of range 1..{MAX_IC_BLOCK}")
    if s.loop_order not in CONV_LOOP_ORDERS:
        found.append(f"loop_order={s.loop_order!r}; expected one of {', '.join(CONV_LOOP_ORDERS)}")
    if s.unroll_kw not in (0, 1):
        found.append(f"unroll_kw={s.unroll_kw} must be 0 or 1")
    found += threads_problem(s.threads, hw)
    if s.parallel not in CONV_PARALLEL_AXES:
        found.append(f"parallel={s.parallel!r}; expected one of {', '.join(CONV_PARALLEL_AXES)}")
    elif s.threads > 1 and s.parallel != "oc":
        found.append(f"{what} splits channels over threads: use parallel='oc'")
    if not found:
        floats = s.threads * plane_buffer_floats(op, s)[2]
        if 4 * floats > MAX_PACKED_BYTES:
            found.append(f"plane buffers would take {4 * floats >> 20} MiB "
                         f"(> {MAX_PACKED_BYTES >> 20} MiB)")
    return found


LOCAL_INPUT_SHARE = 4
"""A dense direct convolution on a blocked input splits its pixels over threads where its
input is larger than 1/LOCAL_INPUT_SHARE of its weights, else its output channels
(:func:`local_axis`)."""


def local_axis(op: OpSignature, threads: int) -> str | None:
    """The thread split of a dense direct convolution on a blocked input inside a model, at
    ``threads`` > 1: ``pixel`` where the input is larger than a quarter of the weights, else
    ``oc``; None where the rule does not apply (other layouts, groups, one thread).

    Split by output channels, every thread reads the whole input; split by pixels, every
    thread reads all the weights. In a model the input was just written by the kernels
    before, each thread's share in its own core's caches, while the weights come from
    memory either way. Tuned alone, both splits ran within 3% of each other; in ResNet-50 at
    two threads on the AVX-512 Xeon VM, splitting pixels ran the 56x56 and 28x28 1x1 layers
    in 0.72-0.96x the time and the 1024-channel 14x14 ones in 0.86-0.97x, while the 7x7
    layers (weights 10-40x their input) ran 1.04-1.28x (ARCHITECTURE change 78)."""
    if threads <= 1 or is_depthwise(op) or op.dim("groups") != 1 or not conv2d_blocks(op)[0]:
        return None
    d = op.dims_dict
    inputs = d["N"] * d["C"] * d["H"] * d["W"]
    weights = d["F"] * d["C"] * d["R"] * d["S"]
    return "pixel" if inputs * LOCAL_INPUT_SHARE > weights else "oc"


def local_split(op: OpSignature, s: Conv2dSchedule) -> Conv2dSchedule:
    """``s`` with the thread split of :func:`local_axis` where that applies to a direct
    schedule (``in_model`` of the conv2d kind)."""
    axis = local_axis(op, s.threads) if s.algorithm == "direct" else None
    return s if axis is None or axis == s.parallel else s.replace(parallel=axis)


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def default_conv2d_schedule(op: OpSignature, hw: HardwareSpec, threads: int = 1,
                            algorithm: str = "direct") -> Conv2dSchedule:
    """A reasonable hand-picked conv2d schedule (LIBXSMM/TVM-style fallbacks).

    ``direct``: one or two vectors of output channels, as many output columns as the
    register file allows (a divisor of the output width when one is close), ``ic_block`` the
    largest divisor of the group's channels up to 64. ``gemm``: a 6-row x 2-vector tile.
    """
    d = op.dims_dict
    lanes, regs = hw.lanes, hw.vector_registers
    cg, fg = d["C"] // d["groups"], d["F"] // d["groups"]
    q = op.out_w
    ic_block = _largest_divisor(cg, 64)
    parallel = "oc"
    if algorithm == "gemm":
        mr = 6 if regs <= 16 else 12
        nv = 2
        mr = max(1, min(mr, (regs - nv - 1) // nv, fg))
        if threads > 1 and fg < mr * threads * 2:
            parallel = "pixel"
        return Conv2dSchedule(oc_block=mr, ow_block=nv * lanes, ic_block=min(cg, 128),
                              algorithm="gemm", threads=threads, parallel=parallel)
    width = fg if not is_depthwise(op) else d["C"]
    nv = 2 if width >= 2 * lanes and regs > 16 else 1
    xi, xo = conv2d_blocks(op)
    if is_depthwise(op) and max(xi, xo) % (nv * lanes):
        nv = 1  # a depthwise tile stays inside one block of a blocked layout
    if xi and not is_depthwise(op):
        ic_block = xi
    max_ow = min(MAX_OW_BLOCK, (regs - nv - 1) // nv, 28)
    ow = min(q, max_ow)
    if q > max_ow:
        # Prefer a divisor of Q near the maximum, so no narrow tail tile is needed.
        div = _largest_divisor(q, max_ow)
        if div * 2 > max_ow:
            ow = div
    oh = 1
    if q <= max_ow // 2 and op.out_h > 1:
        oh = max(1, min(MAX_OH_BLOCK, max_ow // ow, op.out_h))
    blocks = -(-width // (nv * lanes)) * (d["groups"] if not is_depthwise(op) else 1)
    if threads > 1 and blocks < 2 * threads:
        parallel = "pixel"
    return Conv2dSchedule(oc_block=nv * lanes, ow_block=ow, oh_block=oh,
                          ic_block=1 if is_depthwise(op) else ic_block,
                          threads=threads, parallel=parallel)


