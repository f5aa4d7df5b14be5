"""What the int8 and bf16 conv2d (``dtype=int8|bf16``) add to the kind: their signatures'
rules, the knobs their kernel has (``emit_lowp.py``), its default schedule and the numpy
reference.

Both are dense (one group), undilated and take float32 X (or X already narrow: the
``narrow`` attribute, :data:`NARROW_CHOICES`). An int8 conv2d has ``qa = [scale,
zero point]`` (X quantized to uint8 inside the kernel, the padding at the zero point), int8 W
``[F,C,R,S]`` and an epilogue that starts ``dequant+bias``: per-output-channel scales, then
the bias that holds the zero point's term, then ``add`` and an activation as for float32. A
bf16 conv2d rounds X to bfloat16 inside the kernel, takes bfloat16 W and accumulates in
float32; its epilogue is float32's. A bf16 depthwise conv2d is the float32 depthwise kernel
(:func:`runs_float_kernel`) with weights of bfloat16 values and X and Y bfloat16 where narrow.
The narrow rules of a chained float32 depthwise conv2d (uint8 Y, uint8 X with ``xq``) live
here too, beside the int8 ones they pair with.
"""

from __future__ import annotations

import numpy as np

from tunecache.compiler.codegen.epilogue import CHANNEL_OPERAND, chain_rows, operand_tensors
from tunecache.compiler.codegen.epilogue import reference as epilogue_reference
from tunecache.compiler.elements import from_bfloat16, to_bfloat16
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import narrow_tensors
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule, is_depthwise
from tunecache.compiler.kinds.layouts import channel_block, from_layout, to_layout
from tunecache.compiler.kinds.matmul import quantize_u8, tile_dtypes
from tunecache.compiler.kinds.matmul.emit_tiles import (
    TILE_BYTES,
    TILE_REGISTERS,
    TILE_ROWS,
    tiles_used,
)
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import threads_problem

__all__ = ["MIN_BF16_CHANNELS", "MIN_LOWP_FILL", "NARROW_CHOICES", "bf16_variant", "block_fill",
           "chained_depthwise",
           "default_lowp_schedule", "lowp_problems", "lowp_reference", "lowp_signature_problems",
           "narrow_problems", "narrow_type", "packed_channels", "pixel_channels",
           "plane_width", "quantizer_rows", "reads_x_in_place", "runs_float_kernel", "subsamples",
           "tile_pixel_channels", "tiles_plane", "with_narrow"]

NARROW_TENSORS = ("x", "y", "add")
"""The activations a low-precision conv2d may hold narrow (:func:`narrow_type`), in the
``narrow`` attribute's order."""
NARROW_CHOICES = ("none", *("+".join(t for i, t in enumerate(NARROW_TENSORS) if mask >> i & 1)
                            for mask in range(1, 1 << len(NARROW_TENSORS))))
"""The ``narrow`` attribute's values: ``none`` (the default), ``x``, ``y``, ``x+y``, ... An
int8 conv2d's X as uint8 (``x``) is already quantized with ``qa`` (the kernel copies its
bytes); its Y as uint8 (``y``) is the epilogue's last value, a whole number in 0..255 (the
chain that quantized it ends by adding the zero point); a uint8 residual (``add``) stands
for ``(add - aq[1]) * aq[0]``. A bf16 conv2d's narrow tensors are bfloat16: X as the kernel
would have rounded it, Y and a residual rounded to nearest (ties to even). Activations flow
between int8 kernels a byte each and between bf16 ones two bytes, not four."""

LOWP_KNOBS: dict[str, int | str] = {"algorithm": "direct", "pack_w": 1, "oh_block": 1,
                                    "loop_order": "fp", "unroll_kw": 0}
"""The knobs the int8 kernel has one value of."""
MAX_VECTORS = 4
MIN_LOWP_FILL = 0.5
"""The least share of a packed pixel's 16 channels a low-precision conv2d must fill to beat
the float32 kernel (8 of 16: the int8 dot product does four times the float32 FMA's work a
cycle, but a 16-channel block of 3 channels wastes 13)."""
MIN_BF16_CHANNELS = 8
"""The fewest input channels a bf16 conv2d takes. A bf16 dot product does only twice the
float32 FMA's work: ResNet-50's 3-channel stem with its taps folded ran 2.09 ms against 2.12
in float32 (Zen 4), so RGB stems stay float32 under ``--precision bf16`` (unless on tiles)."""


def packed_channels(c: int, s: int, pixc: int = 16) -> tuple[int, int]:
    """``(channels of a packed pixel, taps a row loop walks)`` for C channels and S taps a
    row: the S taps folded into the pixel (channel ``k`` is tap ``k // C`` of channel
    ``k % C``) where that takes fewer ``pixc``-channel blocks (a 3-channel 7x7 stem: 2
    blocks of 16, not 7), else C and S."""
    return (s * c, 1) if -(-s * c // pixc) < s * -(-c // pixc) else (c, s)


def tiles_plane(op: OpSignature) -> bool:
    """Whether the tile kernel sweeps ``op``'s output as one plane of rows ``WP`` wide
    (:func:`~tunecache.compiler.kinds.conv2d.emit_tiles.tile_plane`): stride 1, the taps not
    folded into the pixel, or a 1x1 that :func:`subsamples`; else it tiles each output row."""
    d = op.dims_dict
    folded = packed_channels(d["C"], d["S"], TILE_BYTES // op.dtype_bytes)[1] != d["S"]
    return (d["stride_h"] == d["stride_w"] == 1 and not folded) or subsamples(op)


def subsamples(op: OpSignature) -> bool:
    """Whether the tile kernel packs the pixels a strided, unpadded 1x1 reads into a dense
    plane (``P x Q``) and convolves it with stride 1: row by row, ResNet-50's 14->7 shortcut
    (1024->2048) loaded every weight tile once per 7-pixel row, from a 16-pixel tile; on the
    plane, once per 32 of its 49 pixels."""
    d = op.dims_dict
    return _unpadded_1x1(op) and (d["stride_h"], d["stride_w"]) != (1, 1)


def _unpadded_1x1(op: OpSignature) -> bool:
    d = op.dims_dict
    return d["R"] == d["S"] == 1 and not any(d[p] for p in ("pad_t", "pad_l", "pad_b", "pad_r"))


def plane_width(op: OpSignature) -> int:
    """The width of the rows a plane-sweeping tile kernel (:func:`tiles_plane`) tiles: the
    padded input's, or the output's where it :func:`subsamples`."""
    d = op.dims_dict
    return op.out_w if subsamples(op) else d["W"] + d["pad_l"] + d["pad_r"]


def reads_x_in_place(op: OpSignature, s: Conv2dSchedule) -> bool:
    """Whether the tile kernel reads ``op``'s X where it lies, unpacked: X already narrow
    (bfloat16) in blocks of one tile row (``TILE_ROW_LAYOUT``, the packed pixel's
    channels), a 1x1 of stride 1 without padding (the packed pixels would be X's), and at
    least one tile of pixels (the plane's last tile then ends at X's last pixel)."""
    d = op.dims_dict
    return (s.loop_order == "amx" and "x" in narrow_tensors(op)
            and channel_block(op.attr("layout")) == pixel_channels(op, s)
            and _unpadded_1x1(op) and d["stride_h"] == d["stride_w"] == 1
            and op.out_h * op.out_w >= s.ow_block)


def pixel_channels(op: OpSignature, s: Conv2dSchedule) -> int:
    """The channels of one block of a packed pixel: 16 for the vector kernel,
    :func:`tile_pixel_channels` for the tile kernel (``loop_order=amx``)."""
    return tile_pixel_channels(op) if s.loop_order == "amx" else 16


def tile_pixel_channels(op: OpSignature) -> int:
    """The tile kernel's pixel block: a tile row of 64 bytes (64 u8 or 32 bf16), or half of
    one where X is bfloat16 already in blocks of 16 channels that a 1x1 of stride 1 reads
    in place, or where an RGB stem's folded taps fit half a row: each K step then fills half
    a tile's depth (``TCONFIG_K``). MobileNet-v2's 16- and 96- to 144-channel blocks write
    16-channel blocks (a strided depthwise layer, or 144 channels, not whole 32s); packing
    them into 32-channel pixels cost as much as the products (1x1 16->96 at 112x112: 0.189
    ms packed, 0.145 in place). Its 3x3 stem packs 9 channels a pixel: in 16, not 32, it
    ran 0.126 ms, not 0.170 (half the packed bytes; one thread, AMX Xeon)."""
    d = op.dims_dict
    half_row = TILE_BYTES // 2 // op.dtype_bytes
    in_place = ("x" in narrow_tensors(op) and channel_block(op.attr("layout")) == half_row
                and _unpadded_1x1(op) and d["stride_h"] == d["stride_w"] == 1)
    kc, ks = packed_channels(d["C"], d["S"], half_row)
    half = op.dtype == "bf16" and (in_place or (ks != d["S"] and kc <= half_row))
    return TILE_BYTES // op.dtype_bytes // (2 if half else 1)


def block_fill(op: OpSignature) -> float:
    """The share of the 16-channel blocks of ``op``'s packed pixels that hold channels."""
    kc, _ = packed_channels(op.dim("C"), op.dim("S"))
    return kc / (16 * -(-kc // 16))


U8_QUANTIZER = ("cmax", "cmin", "qround", "cadd")
"""How an int8 conv2d's epilogue ends when it writes uint8 Y: saturated to ``[-z, 255 -
z]``, rounded, plus ``z`` (the zero point): QuantizeLinear's steps after its divide (which
comes before, as a ``cdiv`` or composed into earlier steps)."""


def quantizer_rows(op: OpSignature, chan: np.ndarray) -> np.ndarray:
    """``chan`` (random rows for ``op``'s chain) with the rows of its closing
    :data:`U8_QUANTIZER` made a quantizer of zero point 128, and a ``cdiv`` before it a
    scale at which the epilogue's values spread over uint8 rather than saturate (random
    inputs)."""
    out = np.array(chan, dtype=np.float32)
    out[-3:] = np.array([[-128.0], [127.0], [128.0]], np.float32)
    if op.epilogue[-len(U8_QUANTIZER) - 1] == "cdiv":
        taps = op.dim("C") // op.dim("groups") * op.dim("R") * op.dim("S")
        # int8: sums of u8 x s8 products times standard normal scales; float32: of normals
        out[-4] = (240.0 if op.dtype == "int8" else 1 / 40) * taps ** 0.5
    return out


def narrow_type(op: OpSignature) -> str:
    """The element type of the tensors ``op`` holds narrow: bfloat16 for a bf16 conv2d,
    else uint8."""
    return "bfloat16" if op.dtype == "bf16" else "uint8"


def runs_float_kernel(op: OpSignature) -> bool:
    """Whether the float32 kernels run ``op``: float32, or a bf16 depthwise conv2d (its
    weights' bfloat16 values as floats; a dot product of pairs has no use for one channel a
    group, so only its activations' bytes are bf16's to save)."""
    return op.dtype == "float32" or (op.dtype == "bf16" and is_depthwise(op))


def with_narrow(op: OpSignature, tensors: frozenset[str]) -> OpSignature | None:
    """``OpKind.with_narrow``: ``op`` holding ``tensors`` (and those it held) narrow, or None
    where it cannot: float32 (but a quantizing depthwise Y), a tensor it lacks (a residual
    without ``add``), or an int8 Y its epilogue does not quantize."""
    held = narrow_tensors(op) | tensors
    if runs_float_kernel(op):
        return None if _float_narrow_problem(op, held) else _holding(op, held)
    if not held <= set(NARROW_TENSORS) or (
            "add" in held and "add" not in operand_tensors(op.epilogue)) or (
            op.dtype == "int8" and "y" in held and
            op.epilogue[-len(U8_QUANTIZER):] != U8_QUANTIZER):
        return None
    return _holding(op, held)


def chained_depthwise(op: OpSignature) -> bool:
    """Whether ``op`` is a float32 depthwise conv2d that takes an element-wise chain: its
    direct kernel's stores apply it (a quantized MobileNet's pair and BatchNormalization
    after each depthwise layer), in whole 16-channel blocks (no padding lanes to keep at
    zero through the chain's steps)."""
    return op.dtype == "float32" and _whole_depthwise(op)


def _whole_depthwise(op: OpSignature) -> bool:
    """A depthwise conv2d of whole 16-channel blocks."""
    d = op.dims_dict
    return d["groups"] == d["C"] == d["F"] and d["F"] % 16 == 0


def _float_narrow_problem(op: OpSignature, held: frozenset[str]) -> str:
    """Why a conv2d the float32 kernels run cannot hold ``held`` narrow (empty: it can).
    Only a depthwise one may: Y (uint8 where its float32 chain ends with the quantizer,
    bfloat16 for a bf16 one), X (uint8 dequantized with ``xq``, or bfloat16) where it is
    padded, so its kernel copies X with its border (into a band of rows, or whole from a
    plain X) and widens it there."""
    kind, narrow = f"a {op.dtype} conv2d", narrow_type(op)
    if not held <= {"x", "y"}:
        return f"{kind} holds only X and Y narrow"
    if "y" in held and op.dtype == "bf16" and not _whole_depthwise(op):
        return f"{kind} writes {narrow} Y only as a depthwise one of whole 16-channel blocks"
    if "y" in held and op.dtype == "float32" and not _quantizes(op):
        return (f"{kind} writes {narrow} Y only as a depthwise one of whole 16-channel "
                f"blocks whose epilogue ends {'+'.join(U8_QUANTIZER)}")
    d = op.dims_dict
    if "x" in held and not (_whole_depthwise(op)
                            and any(d[p] for p in ("pad_t", "pad_l", "pad_b", "pad_r"))):
        return (f"{kind} reads {narrow} X only as a depthwise one of whole 16-channel blocks "
                "with padding (its kernel copies X with its border)")
    return ""


def _quantizes(op: OpSignature) -> bool:
    """Whether a float32 conv2d's epilogue ends with the quantizer (a depthwise one's
    chain: its kernel then stores bytes, for the int8 convolution reading them)."""
    return op.epilogue[-len(U8_QUANTIZER):] == U8_QUANTIZER and chained_depthwise(op)


def _holding(op: OpSignature, held: frozenset[str]) -> OpSignature:
    text = "+".join(t for t in NARROW_TENSORS if t in held) or "none"
    return OpSignature(op.kind, op.dims, op.dtype,
                       tuple((k, text if k == "narrow" else v) for k, v in op.attrs), op.epilogue)


def narrow_problems(op: OpSignature) -> list[str]:
    """Why a conv2d the float32 kernels run cannot hold what its ``narrow`` names (empty: it
    holds nothing, or what a depthwise one may)."""
    held = narrow_tensors(op)
    problem = _float_narrow_problem(op, held) if held else ""
    return [f"narrow={op.attr('narrow')}: {problem}"] if problem else []


def lowp_signature_problems(op: OpSignature) -> list[str]:
    """Why an int8 or bf16 conv2d signature has no kernel (empty when it has)."""
    d = op.dims_dict
    found = []
    if "add" in narrow_tensors(op) and "add" not in operand_tensors(op.epilogue):
        found.append("narrow=...add needs a residual (add or radd) in the epilogue")
    if op.dtype == "int8" and "y" in narrow_tensors(op) and \
            op.epilogue[-len(U8_QUANTIZER):] != U8_QUANTIZER:
        found.append(f"a uint8 Y is quantized: the epilogue ends {'+'.join(U8_QUANTIZER)}")
    a = f"an {op.dtype}" if op.dtype[0] in "aeiou" else f"a {op.dtype}"
    if d["groups"] != 1:
        found.append(f"{a} conv2d is dense (groups=1) so far, not groups={d['groups']}")
    if d["dil_h"] != 1 or d["dil_w"] != 1:
        found.append(f"{a} conv2d has no dilation so far")
    if op.dtype == "bf16":
        if "dequant" in op.epilogue:
            found.append("dequant is an int8 conv2d's epilogue step")
    elif op.epilogue[:2] != ("dequant", "bias"):
        found.append("an int8 conv2d's epilogue starts with dequant+bias (the zero point's "
                     f"term is in the bias), not {'+'.join(op.epilogue) or 'none'}")
    return found


def bf16_variant(op: OpSignature, hw: HardwareSpec) -> tuple[OpSignature, bool] | None:
    """``OpKind.bf16_variant``: a dense, undilated float32 conv2d as the bf16 kernel
    (weights as they are): of at least :data:`MIN_BF16_CHANNELS` input channels, or any
    where ``hw`` has bf16 tiles (ResNet-50's RGB stem, taps folded: 0.73 ms against 1.25
    in float32, one thread, AMX Xeon). A depthwise one without an element-wise chain as a
    bf16 depthwise conv2d (:func:`runs_float_kernel`), so the activations on either side
    of it can stay bfloat16."""
    d = op.dims_dict
    bf16 = OpSignature(op.kind, op.dims, "bf16", op.attrs, op.epilogue)
    if op.dtype == "float32" and is_depthwise(op) and not _has_chain(op):
        return bf16, False
    if op.dtype != "float32" or d["groups"] != 1 or (d["dil_h"], d["dil_w"]) != (1, 1):
        return None
    if d["C"] < MIN_BF16_CHANNELS and "bf16" not in tile_dtypes(hw):
        return None
    return bf16, False


def _has_chain(op: OpSignature) -> bool:
    """Whether ``op``'s epilogue goes on past its activation (an element-wise chain)."""
    return bool(chain_rows(op.epilogue)) or "qround" in op.epilogue


def lowp_problems(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``s`` is illegal for the int8 or bf16 conv2d ``op`` on ``hw``."""
    tiles = s.loop_order == "amx"
    found = [f"a low-precision conv2d takes {knob}={want!r}, not {getattr(s, knob)!r}"
             for knob, want in LOWP_KNOBS.items()
             if getattr(s, knob) != want and not (tiles and knob == "loop_order")]
    if tiles:
        return found + _tile_problems(op, s, hw) + threads_problem(s.threads, hw)
    lanes = hw.lanes
    if s.oc_block < lanes or s.oc_block % lanes or s.oc_block > MAX_VECTORS * lanes:
        found.append(f"oc_block={s.oc_block} must be 1 to {MAX_VECTORS} vectors of {lanes}")
    elif s.ow_block < 1 or s.ow_block * (s.oc_block // lanes) > max_accumulators(
            hw, s.oc_block // lanes):
        found.append(f"a {op.dtype} tile of {s.ow_block} pixels x {s.oc_block} channels needs "
                     f"more than {max_accumulators(hw, s.oc_block // lanes)} accumulators on "
                     f"{hw.isa}")
    return found + threads_problem(s.threads, hw)


def _tile_problems(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> list[str]:
    """Why the tile kernel cannot run ``op`` under ``s`` on ``hw`` (empty: it can)."""
    found = []
    if op.dtype not in tile_dtypes(hw):
        found.append(f"loop_order=amx needs {op.dtype} matrix tiles (AMX); {hw.hw_id} has none")
    if s.ow_block % TILE_ROWS or s.oc_block % TILE_ROWS or not s.ow_block or not s.oc_block:
        found.append(f"loop_order=amx takes ow_block and oc_block in whole tiles of "
                     f"{TILE_ROWS}, not {s.ow_block} and {s.oc_block}")
    elif tiles_used(s.ow_block, s.oc_block) > TILE_REGISTERS:
        found.append(f"a tile of {s.ow_block} pixels x {s.oc_block} channels needs "
                     f"{tiles_used(s.ow_block, s.oc_block)} tile registers; there are "
                     f"{TILE_REGISTERS}")
    if s.ic_block != pixel_channels(op, s):
        found.append(f"loop_order=amx packs {pixel_channels(op, s)} {op.dtype} channels a "
                     f"pixel block: ic_block={pixel_channels(op, s)}, not {s.ic_block}")
    return found


def max_accumulators(hw: HardwareSpec, vectors: int) -> int:
    """Accumulators a tile of ``vectors`` weight vectors a step may have: half the
    registers, or on 16 what the weights, the broadcast and a product's temporary leave
    (half of 16 kept the AVX2 tile at one vector of 8 channels, whose broadcasts
    dominated: 54 against 71 GFLOP/s for 4 x 16 on a ResNet 3x3 layer, Zen 3)."""
    half = hw.vector_registers // 2
    return max(half, hw.vector_registers - vectors - 2) if hw.vector_registers <= 16 else half


def default_lowp_schedule(op: OpSignature, hw: HardwareSpec, threads: int = 1) -> Conv2dSchedule:
    """On matrix tiles where ``hw`` has them for the dtype: two tiles of pixels (one for
    rows of at most 16) by two of channels (one for at most 16). Else two vectors of
    channels (one for few channels), as many pixels as :func:`max_accumulators` allows, at
    most the row."""
    if op.dtype in tile_dtypes(hw):
        swept = op.out_h * op.out_w if tiles_plane(op) else op.out_w
        mt = 2 if swept > TILE_ROWS else 1
        nt = 2 if op.dim("F") > TILE_ROWS else 1
        return Conv2dSchedule(oc_block=nt * TILE_ROWS, ow_block=mt * TILE_ROWS,
                              ic_block=tile_pixel_channels(op), loop_order="amx",
                              threads=threads)
    nv = 2 if op.dim("F") >= 2 * hw.lanes else 1
    width = max(1, min(max_accumulators(hw, nv) // nv, op.out_w, 14))
    return Conv2dSchedule(oc_block=nv * hw.lanes, ow_block=width, ic_block=16,
                          threads=threads)


def lowp_reference(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """X quantized as the kernel does, padded with the zero point, the integer convolution,
    then the epilogue (bf16: X rounded to bfloat16, padded with zeros, W's values)."""
    d = op.dims_dict
    names = [a.name for a in op.arguments() if a.role == "input"]
    args = dict(zip(names, inputs, strict=True))
    plain = from_layout(args["X"], op.attr("layout"), d["C"])
    if op.dtype == "int8":
        x = plain if "x" in narrow_tensors(op) else quantize_u8(plain, args["qa"])
        zero = int(np.float32(args["qa"][1]))
    else:
        x = from_bfloat16(to_bfloat16(np.asarray(plain, dtype=np.float32)))
        zero = 0
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (d["pad_t"], d["pad_b"]),
                                           (d["pad_l"], d["pad_r"])), constant_values=zero)
    w = np.asarray(args["W"], dtype=np.float64)
    p, q = op.out_h, op.out_w
    acc = np.zeros((d["N"], d["F"], p, q))
    for r in range(d["R"]):
        for s in range(d["S"]):
            patch = padded[:, :, r:r + d["stride_h"] * (p - 1) + 1:d["stride_h"],
                           s:s + d["stride_w"] * (q - 1) + 1:d["stride_w"]]
            acc += np.einsum("nchw,fc->nfhw", patch, w[:, :, r, s])
    operands: dict[str, np.ndarray] = {name: args[name].reshape(1, -1, 1, 1)
                                       for name in ("scale", "bias") if name in args}
    if CHANNEL_OPERAND in args:
        operands[CHANNEL_OPERAND] = args[CHANNEL_OPERAND].reshape(-1, 1, d["F"], 1, 1)
    if "add" in args:
        operands["add"] = from_layout(args["add"], op.attr("out_layout"), d["F"])
        if "aq" in args:  # a uint8 residual, dequantized as DequantizeLinear does
            aq = np.asarray(args["aq"], np.float32)
            operands["add"] = (operands["add"].astype(np.float32) - aq[1]) * aq[0]
    return to_layout(epilogue_reference(op.epilogue, acc, operands), op.attr("out_layout"))
