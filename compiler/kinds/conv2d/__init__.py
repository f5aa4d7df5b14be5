"""The ``conv2d`` kind: 2-D cross-correlation (ONNX ``Conv``), then the epilogue.

``X[N,C,H,W]`` with ``W[F,C/groups,R,S]`` into ``Y[N,F,P,Q]``, with integer
parameters ``stride_h, stride_w`` (default 1), ``pad_t, pad_l, pad_b, pad_r`` (default 0,
asymmetric as ONNX ``pads`` gives them), ``dil_h, dil_w`` (default 1) and ``groups``
(default 1; depthwise when ``groups == C``).
``P = (H + pad_t + pad_b - dil_h*(R-1) - 1) // stride_h + 1`` and likewise ``Q``.
Epilogue: ``bias`` adds ``bias[F]``, ``add`` a residual tensor of the output's shape, then
at most one activation (:data:`ACTIVATIONS`): ``relu`` clamps at zero, ``clip6`` at 0 and 6
(ReLU6), ``silu`` is ``x * sigmoid(x)``, ``hardswish`` and ``hardsigmoid`` MobileNet-v3's,
``gelu_erf`` and ``gelu_tanh`` Whisper's and wav2vec's, ``mish`` YOLOv4's (the steps of
:mod:`~tunecache.compiler.codegen.epilogue`).
An int8 or bf16 conv2d's epilogue may go on with an element-wise chain over its channels
(``CHAIN_STEPS``, reading ``chan[steps, F]``): quantize-dequantize pairs, an unfolded
BatchNormalization and a Clip after a quantized convolution (:func:`channel_view`).
Attributes: ``layout`` (X's layout) and ``out_layout`` (Y's and
``add``'s; left out of the text while ``nchw``), each ``nchw`` or a channel-blocked
``nchw{x}c`` (:mod:`tunecache.compiler.kinds.layouts`); ``narrow`` (left out while
``none``): which of X, Y and the residual ``add`` an int8 or bf16 conv2d holds as uint8 or
bfloat16 activations between kernels (``x+y+add``, :data:`~.lowp.NARROW_CHOICES`).
Schedules: ``space.py``; kernels: ``emit.py`` (which picks the algorithm's emitter module);
docs/CONV2D.md.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tunecache.compiler.codegen.epilogue import (
    CHAIN_STEPS,
    CHANNEL_OPERAND,
    RESIDUAL_STEP,
    chain_rows,
    operand_tensors,
)
from tunecache.compiler.codegen.epilogue import reference as epilogue_reference
from tunecache.compiler.elements import from_bfloat16, to_bfloat16
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import ChannelView, OpKind, narrow_tensors, register
from tunecache.compiler.kinds.conv2d.emit import generate_conv2d
from tunecache.compiler.kinds.conv2d.lowp import (
    MIN_LOWP_FILL,
    NARROW_CHOICES,
    bf16_variant,
    block_fill,
    chained_depthwise,
    default_lowp_schedule,
    lowp_problems,
    lowp_reference,
    lowp_signature_problems,
    narrow_problems,
    narrow_type,
    quantizer_rows,
    runs_float_kernel,
    with_narrow,
)
from tunecache.compiler.kinds.conv2d.space import (
    Conv2dSchedule,
    conv2d_blocks,
    conv2d_problems,
    default_conv2d_schedule,
    is_depthwise,
    local_split,
    plane_buffer_floats,
)
from tunecache.compiler.kinds.layouts import (
    LAYOUTS,
    NCHW,
    TILE_ROW_LAYOUT,
    channel_block,
    from_layout,
    random_tensor,
    tensor_shape,
    to_layout,
    with_attrs,
)
from tunecache.compiler.kinds.matmul import epilogue_tuple
from tunecache.compiler.ops import (
    KindSpec,
    OpSignature,
    TensorArg,
    kernel_extent_problems,
    window_params,
)

__all__ = ["ACTIVATIONS", "MIN_LOWP_FILL", "Conv2dSchedule", "block_fill", "conv2d_blocks",
           "conv2d_nchw", "conv2d_op", "is_depthwise", "nchw_conv2d", "plane_buffer_floats"]


ACTIVATIONS = ("relu", "clip6", "silu", "hardswish", "hardsigmoid", "gelu_erf", "gelu_tanh",
               "mish")
"""The epilogue's activations, after ``bias`` and ``add``; an op has at most one."""


def conv2d_op(N: int, C: int, H: int, W: int, F: int, R: int, S: int, *,
              stride: int | tuple[int, int] = 1, pads: int | tuple[int, int, int, int] = 0,
              dilation: int | tuple[int, int] = 1, groups: int = 1,
              epilogue: tuple[str, ...] | str = (), dtype: str = "float32",
              layout: str = NCHW, out_layout: str = NCHW, narrow: str = "none") -> OpSignature:
    """``Y[N,F,P,Q] = conv(X[N,C,H,W], W[F,C/groups,R,S])``.

    ``stride`` and ``dilation`` are ``(h, w)`` or one int for both; ``pads`` is
    ``(top, left, bottom, right)`` (ONNX ``pads`` order) or one int for all four.
    ``layout`` is X's layout, ``out_layout`` Y's (and the residual's): ``nchw`` or
    ``nchw{x}c``. ``narrow`` names the tensors an int8 or bf16 conv2d holds as uint8 or
    bfloat16 (``x+y``).
    """
    return OpSignature(
        KIND.name,
        (("N", N), ("C", C), ("H", H), ("W", W), ("F", F), ("R", R), ("S", S),
         *window_params(stride, pads, dilation), ("groups", groups)),
        dtype,
        (("layout", layout), ("out_layout", out_layout), ("narrow", narrow)),
        epilogue_tuple(epilogue),
    )


def nchw_conv2d(op: OpSignature) -> OpSignature:
    """``op`` with plain ``nchw`` input and output (itself when it has them)."""
    return with_attrs(op, layout=NCHW, out_layout=NCHW)


def _signature_problems(op: OpSignature) -> list[str]:
    d = op.dims_dict
    found = []
    g = d["groups"]
    blocks = {channel_block(op.attr(name)) for name in ("layout", "out_layout")} - {0}
    if TILE_ROW_LAYOUT in (op.attr("layout"), op.attr("out_layout")) and op.dtype != "bf16":
        found.append(f"{TILE_ROW_LAYOUT} holds bfloat16 between bf16 conv2ds only")
    elif len(blocks) > 1 and runs_float_kernel(op):
        found.append(f"layout={op.attr('layout')} and out_layout={op.attr('out_layout')} "
                     "block channels differently; use one block size")
    activations = [step for step in op.epilogue if step in ACTIVATIONS]
    if len(activations) > 1:
        found.append(f"epilogue {'+'.join(op.epilogue)} has {len(activations)} activations "
                     f"({', '.join(activations)}); at most one")
    if d["C"] % g:
        found.append(f"input channels C={d['C']} are not divisible by groups={g}")
    if d["F"] % g:
        found.append(f"output channels F={d['F']} are not divisible by groups={g}")
    if not runs_float_kernel(op):
        found += lowp_signature_problems(op)
    elif "dequant" in op.epilogue:
        found.append("dequant is an int8 conv2d's epilogue step")
    elif (chain_rows(op.epilogue) or "qround" in op.epilogue) and not chained_depthwise(op):
        found.append("an element-wise chain (cadd, cmul, qround, ...) follows an int8 or bf16 "
                     "conv2d's epilogue, or a float32 depthwise one's of whole 16-channel "
                     "blocks")
    elif RESIDUAL_STEP in op.epilogue:
        found.append("radd follows an int8 or bf16 conv2d's epilogue, not a float32 one's")
    if runs_float_kernel(op):
        found += narrow_problems(op)
    return found + kernel_extent_problems(op)


def _arguments(op: OpSignature) -> tuple[TensorArg, ...]:
    d = op.dims_dict
    out_shape = tensor_shape(d["N"], d["F"], op.out_h, op.out_w, op.attr("out_layout"))
    held = narrow_tensors(op)

    def activation(tensor: str) -> str:
        return narrow_type(op) if tensor in held else "float32"

    args = [
        TensorArg("X", tensor_shape(d["N"], d["C"], d["H"], d["W"], op.attr("layout")), "input",
                  activation("x")),
        TensorArg("W", (d["F"], d["C"] // d["groups"], d["R"], d["S"]), "input",
                  "float32" if runs_float_kernel(op) else
                  {"int8": "int8", "bf16": "bfloat16"}[op.dtype]),
    ]
    if op.dtype == "int8":
        args.append(TensorArg("qa", (2,), "input"))
    if "dequant" in op.epilogue:
        args.append(TensorArg("scale", (d["F"],), "input"))
    if "bias" in op.epilogue:
        args.append(TensorArg("bias", (d["F"],), "input"))
    if "add" in operand_tensors(op.epilogue):  # before an activation, or within a chain
        args.append(TensorArg("add", out_shape, "input", activation("add")))
    if "add" in held and op.dtype == "int8":
        args.append(TensorArg("aq", (2,), "input"))
    if chain_rows(op.epilogue):
        args.append(TensorArg(CHANNEL_OPERAND, (chain_rows(op.epilogue), d["F"]), "input"))
    if "x" in held and op.dtype == "float32":  # a uint8 X's [scale, zero point]
        args.append(TensorArg("xq", (2,), "input"))
    args.append(TensorArg("Y", out_shape, "output", activation("y")))
    return tuple(args)


def channel_view(op: OpSignature) -> ChannelView | None:
    """``OpKind.channel_view``: an int8 or bf16 conv2d, or a float32 depthwise one
    (:func:`chained_depthwise`), writing NCHW takes a chain over its channels (``M = N*F``
    rows of ``P*Q``, a per-channel operand one value per row)."""
    if (runs_float_kernel(op) and not chained_depthwise(op)) or op.attr("out_layout") != NCHW:
        return None
    d = op.dims_dict
    return ChannelView(rows=d["N"] * d["F"], cols=op.out_h * op.out_w, per_channel="col",
                       channels=d["F"])


def _flops(op: OpSignature) -> int:
    d = op.dims_dict
    return (2 * d["N"] * d["F"] * op.out_h * op.out_w
            * (d["C"] // d["groups"]) * d["R"] * d["S"])


def conv2d_nchw(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, stride: tuple[int, int],
           pads: tuple[int, int, int, int], dilation: tuple[int, int], groups: int) -> np.ndarray:
    """Grouped 2-D cross-correlation in the input's dtype (ONNX ``Conv``)."""
    n, c, _, _ = x.shape
    f, cg, r, s = w.shape
    sh, sw = stride
    dh, dw = dilation
    pt, pl, pb, pr = pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))) if any(pads) else x
    p = (xp.shape[2] - dh * (r - 1) - 1) // sh + 1
    q = (xp.shape[3] - dw * (s - 1) - 1) // sw + 1
    if groups == 1:
        # im2col, then one BLAS matmul.
        win = sliding_window_view(xp, (dh * (r - 1) + 1, dw * (s - 1) + 1), axis=(2, 3))
        win = win[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :p, :q]  # (n, c, p, q, r, s)
        cols = np.ascontiguousarray(win.transpose(0, 2, 3, 1, 4, 5)).reshape(n * p * q, c * r * s)
        y = (cols @ w.reshape(f, c * r * s).T).reshape(n, p, q, f).transpose(0, 3, 1, 2)
    else:
        fg = f // groups
        xg = xp.reshape(n, groups, cg, xp.shape[2], xp.shape[3])
        wg = w.reshape(groups, fg, cg, r, s)
        y5 = np.zeros((n, groups, fg, p, q), dtype=x.dtype)
        for i in range(r):
            for j in range(s):
                h0, w0 = i * dh, j * dw
                patch = xg[:, :, :, h0:h0 + sh * (p - 1) + 1:sh, w0:w0 + sw * (q - 1) + 1:sw]
                if cg == 1:  # depthwise (times a channel multiplier)
                    y5 += patch * wg[None, :, :, 0, i, j, None, None]
                else:
                    y5 += np.einsum("ngcpq,gfc->ngfpq", patch, wg[:, :, :, i, j])
        y = y5.reshape(n, f, p, q)
    if bias is not None:
        y = y + bias.reshape(1, f, 1, 1)
    return np.ascontiguousarray(y, dtype=x.dtype)


def _reference(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    if not runs_float_kernel(op):
        return lowp_reference(op, inputs)
    d = op.dims_dict
    has_bias = "bias" in op.epilogue
    out_layout = op.attr("out_layout")
    args = dict(zip([a.name for a in op.arguments() if a.role == "input"], inputs, strict=True))
    x = from_layout(inputs[0], op.attr("layout"), d["C"])
    if "xq" in args:  # a uint8 X, dequantized as DequantizeLinear does
        xq = np.asarray(args["xq"], np.float32)
        x = (x.astype(np.float32) - xq[1]) * xq[0]
    elif x.dtype == np.uint16:  # a bf16 depthwise conv2d's bfloat16 X
        x = from_bfloat16(x)
    y = conv2d_nchw(x, inputs[1],
                    inputs[2] if has_bias else None,
                    (d["stride_h"], d["stride_w"]),
                    (d["pad_t"], d["pad_l"], d["pad_b"], d["pad_r"]),
                    (d["dil_h"], d["dil_w"]), d["groups"])
    operands: dict[str, np.ndarray] = {}
    if "add" in args:
        operands["add"] = from_layout(args["add"], out_layout, d["F"])
    if CHANNEL_OPERAND in args:
        operands[CHANNEL_OPERAND] = args[CHANNEL_OPERAND].reshape(-1, 1, d["F"], 1, 1)
    # The bias is in y already (conv2d_nchw adds it).
    steps = tuple(step for step in op.epilogue if step != "bias")
    return to_layout(epilogue_reference(steps, y, operands), out_layout)


def _random_inputs(op: OpSignature, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Standard normal inputs, as for every kind; blocked tensors get zero padding lanes.
    An int8 conv2d's weights are integers over int8's range, its ``qa`` ``[1/32, 128]``
    (standard normal X spans most of uint8); uint8 activations (``u8``) are uniform bytes,
    ``aq`` as ``qa``."""
    d = op.dims_dict
    x = op.arguments()[0]
    out: list[np.ndarray] = [
        rng.integers(0, 256, size=x.shape).astype(np.uint8) if x.dtype == "uint8"
        else random_tensor(rng, d["N"], d["C"], d["H"], d["W"], op.attr("layout"))]
    if x.dtype == "bfloat16":
        out[0] = to_bfloat16(out[0])
    for arg in op.arguments()[1:-1]:
        if arg.dtype == "uint8":
            out.append(rng.integers(0, 256, size=arg.shape).astype(np.uint8))
        elif arg.dtype == "int8":
            out.append(rng.integers(-128, 128, size=arg.shape).astype(np.int8))
        elif arg.name == "add":
            add = random_tensor(rng, d["N"], d["F"], op.out_h, op.out_w, op.attr("out_layout"))
            out.append(to_bfloat16(add) if arg.dtype == "bfloat16" else add)
        elif arg.dtype == "bfloat16":
            out.append(to_bfloat16(rng.standard_normal(arg.shape, dtype=np.float32)))
        elif arg.name in ("qa", "aq", "xq"):
            out.append(np.array([1 / 32, 128], np.float32))
        elif arg.name == CHANNEL_OPERAND and "y" in narrow_tensors(op):
            out.append(quantizer_rows(op, rng.standard_normal(arg.shape, dtype=np.float32)))
        else:
            out.append(rng.standard_normal(arg.shape, dtype=np.float32))
    return tuple(out)


def _problems(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> list[str]:
    return conv2d_problems(op, s, hw) if runs_float_kernel(op) else lowp_problems(op, s, hw)


def _default_schedule(op: OpSignature, hw: HardwareSpec, threads: int = 1) -> Conv2dSchedule:
    if not runs_float_kernel(op):
        return default_lowp_schedule(op, hw, threads)
    return default_conv2d_schedule(op, hw, threads)


def _layout_slots(op: OpSignature) -> tuple[str | None, ...]:
    """X in the input layout, a residual in the output's; weights and bias have none."""
    return tuple({"X": "in", "add": "out"}.get(a.name) for a in op.arguments()[:-1])


def _relayout(op: OpSignature, src: str, dst: str) -> OpSignature | None:
    """Any pair of layouts of one block size (the direct kernels read and write both); a
    grouped, not depthwise, convolution only with whole blocks per group. A strided bf16
    depthwise one not in tile-row blocks: its band of one tile's rows, 32 channels wide,
    left L1 (MobileNet-v2's 96-channel 3x3 of stride 2 at 112x112: 0.246 ms against 0.155
    in 16-channel blocks, AMX Xeon, the model 0.06 ms faster so)."""
    d = op.dims_dict
    blocks = {channel_block(src), channel_block(dst)} - {0}
    if len(blocks) > 1 and runs_float_kernel(op):
        return None
    if TILE_ROW_LAYOUT in (src, dst) and runs_float_kernel(op) and d["stride_h"] > 1:
        return None  # a strided band of one tile row leaves L1 (see _relayout's doc)
    if blocks and d["groups"] > 1 and not is_depthwise(op):
        x = blocks.pop()
        if (d["C"] // d["groups"]) % x or (d["F"] // d["groups"]) % x:
            return None
    return with_attrs(op, layout=src, out_layout=dst)


KIND = register(OpKind(
    name="conv2d",
    spec=KindSpec(
        dims=("N", "C", "H", "W", "F", "R", "S"),
        attrs={"layout": (*LAYOUTS, TILE_ROW_LAYOUT), "out_layout": (*LAYOUTS, TILE_ROW_LAYOUT),
               "narrow": NARROW_CHOICES},
        epilogues=("dequant", "bias", "add", *ACTIVATIONS),
        epilogue_tail=(*CHAIN_STEPS.values(), RESIDUAL_STEP),
        params={
            "stride_h": (1, 1), "stride_w": (1, 1),
            "pad_t": (0, 0), "pad_l": (0, 0), "pad_b": (0, 0), "pad_r": (0, 0),
            "dil_h": (1, 1), "dil_w": (1, 1), "groups": (1, 1),
        },
        check=_signature_problems,
        omit_default=frozenset({"out_layout", "narrow"}),
        dtypes=("float32", "int8", "bf16"),
    ),
    arguments=_arguments,
    flops=_flops,
    schedule=Conv2dSchedule,
    problems=_problems,
    default_schedule=_default_schedule,
    in_model=local_split,
    emit=generate_conv2d,
    reference=_reference,
    reduction_length=lambda op: op.dim("C") // op.dim("groups") * op.dim("R") * op.dim("S"),
    dim_columns={
        "N": "dim_batch", "C": "dim_c", "H": "dim_h", "W": "dim_w", "F": "dim_f", "R": "dim_r",
        "S": "dim_s", "stride_h": "stride_h", "stride_w": "stride_w", "pad_t": "pad_t",
        "pad_l": "pad_l", "pad_b": "pad_b", "pad_r": "pad_r", "dil_h": "dil_h",
        "dil_w": "dil_w", "groups": "groups",
    },
    baseline="onnxruntime",
    prepacked_timing=True,
    random_inputs=_random_inputs,
    layout_slots=_layout_slots,
    relayout=_relayout,
    bf16_variant=bf16_variant,
    channel_view=channel_view,
    with_narrow=with_narrow,
    examples=("conv2d(N=1,C=64,H=56,W=56,F=64,R=3,S=3,pad_t=1,pad_l=1,pad_b=1,pad_r=1,"
              "epilogue=bias+relu)",
              "conv2d(N=1,C=32,H=28,W=28,F=32,R=3,S=3,stride_h=2,stride_w=2,pad_t=1,pad_l=1,"
              "pad_b=1,pad_r=1,groups=32,epilogue=bias)",
              "conv2d(N=1,C=256,H=14,W=14,F=64,R=1,S=1,epilogue=bias+add+relu)",
              # Blocked layouts (nchw16c runs on every ISA: whole vectors of 4, 8 or 16):
              # the ResNet-50 stem from an NCHW image, a MobileNet-v2 depthwise layer and a
              # bottleneck's last 1x1 with its residual, all kept blocked.
              "conv2d(N=1,C=3,H=224,W=224,F=64,R=7,S=7,stride_h=2,stride_w=2,pad_t=3,pad_l=3,"
              "pad_b=3,pad_r=3,layout=nchw,out_layout=nchw16c,epilogue=bias+relu)",
              "conv2d(N=1,C=144,H=56,W=56,F=144,R=3,S=3,pad_t=1,pad_l=1,pad_b=1,pad_r=1,"
              "groups=144,layout=nchw16c,out_layout=nchw16c,epilogue=bias+relu)",
              "conv2d(N=1,C=64,H=56,W=56,F=256,R=1,S=1,layout=nchw16c,out_layout=nchw16c,"
              "epilogue=bias+add+relu)"),
))
