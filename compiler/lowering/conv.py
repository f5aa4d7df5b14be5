"""2-D ``Conv`` onto the ``conv2d`` kind, with its foldable followers fused in.

The followers, each the only reader of the running result (not a graph output):

* ``BatchNormalization`` (inference): folded into new weights and bias;
* ``Add`` of a per-channel constant: folded into the bias;
* residual ``Add`` of a float32 tensor of the output's shape: the ``add`` epilogue;
* ``Relu``, ``Clip(0, 6)`` (ReLU6), ``Clip(0, inf)`` or ``x * Sigmoid(x)`` (SiLU): the
  epilogue activation, which ends the chain.

Registered with ``explains``: why a Conv runs in numpy (a 1-D or 3-D convolution, an input
that is not float32, ...) is its numpy node's note.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tunecache.compiler import onnx_ops
from tunecache.compiler.kinds.conv2d import ACTIVATIONS, conv2d_op
from tunecache.compiler.lowering import (
    FusionContext,
    GraphNode,
    activation_step,
    channel_constant,
    clip_step,
    float32_kernel,
    other_input,
    register_lowering,
    silu_nodes,
)


@register_lowering("Conv", explains=True)
def lower_conv(ctx: FusionContext, position: int) -> Any:
    """The conv2d kernel for the Conv at ``position`` and its fused followers, or why not."""
    return float32_kernel(ctx, position, _conv)


def _conv(ctx: FusionContext, position: int) -> Any:
    node = ctx.nodes[position]
    x, w = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    x_shape, w_shape = ctx.shape(x), ctx.shape(w)
    if x_shape is None or w_shape is None:
        # a shape that depends on the data (after a TopK, NonZero or an If): numpy's
        return "an operand whose shape depends on the data"
    if len(x_shape) == 3:  # a 1-D convolution is a 2-D one of height 1
        widened = _height_one_weight(ctx, w, w_shape)
        if widened is None:
            return "a 1-D convolution whose weights are not a constant"
        w = widened
        x_shape, w_shape = (*x_shape[:2], 1, x_shape[2]), (*w_shape[:2], 1, w_shape[2])
    if len(x_shape) != 4:
        return f"{len(x_shape) - 2}-D convolution (kernels are 1-D or 2-D)"
    p = onnx_ops.conv_params(node.attrs, x_shape, w_shape)
    if (pruned := _without_dead_taps(ctx, w, w_shape, x_shape, p)) is not None:
        w, w_shape, p = pruned
    n, c, h, wd = x_shape
    f, _, r, s = w_shape
    epilogue: list[str] = ["bias"] if bias else []
    fused = [position]
    add_input: str | None = None
    weight_name = w
    out = node.outputs[0]
    while True:
        silu = _silu_after(ctx, out)
        if silu is not None:
            epilogue.append("silu")
            fused += silu
            out = ctx.nodes[silu[-1]].outputs[0]
            break
        nxt = ctx.sole_consumer(out)
        if nxt is None:
            break
        follower = ctx.nodes[nxt]
        activation = _activation(ctx, follower, out)
        if activation is not None:
            epilogue.append(activation)
            fused.append(nxt)
            out = follower.outputs[0]
            break
        if follower.op_type == "BatchNormalization" and "add" not in epilogue:
            folded = _fold_bn(ctx, follower, weight_name, bias, f)
            if folded is None:
                break
            weight_name, bias = folded
            epilogue = ["bias"]
        elif follower.op_type == "Add":
            added = _added(ctx, follower, out, bias, epilogue, f"{node.name}/bias")
            if added is None:
                break
            bias, add_input, epilogue = added[0], added[1] or add_input, added[2]
        else:
            break
        fused.append(nxt)
        out = follower.outputs[0]
    sig = conv2d_op(n, c, h, wd, f, r, s, stride=p.stride, pads=p.pads,
                             dilation=p.dilation, groups=p.groups, epilogue=tuple(epilogue))
    inputs = [x, weight_name] + ([bias] if bias else []) + ([add_input] if add_input else [])
    return ctx.finish(position, fused, sig, inputs, out)


def _height_one_weight(ctx: FusionContext, w: str, w_shape: tuple[int, ...]) -> str | None:
    """A 1-D convolution's constant weights ``(F, C, K)`` as a 2-D kernel's ``(F, C, 1, K)``
    (the same bytes), or None when they are not a constant."""
    weights = ctx.constants.get(w)
    if weights is None:
        return None
    return ctx.add_constant(f"{w}/height1", weights.reshape(*w_shape[:2], 1, w_shape[2]))


def _live_taps(size: int, kernel: int, stride: int, dilation: int, before: int,
               after: int) -> tuple[int, int]:
    """The first and last of a ``kernel``'s taps along one axis that read the input (not
    padding) at some output position."""
    outputs = (size + before + after - dilation * (kernel - 1) - 1) // stride + 1
    live = [t for t in range(kernel) if any(
        0 <= o * stride - before + t * dilation < size for o in range(outputs))]
    return (live[0], live[-1]) if live else (0, kernel - 1)


def _without_dead_taps(ctx: FusionContext, w: str, w_shape: tuple[int, ...],
                       x_shape: tuple[int, ...], p: onnx_ops.ConvParams
                       ) -> tuple[str, tuple[int, ...], onnx_ops.ConvParams] | None:
    """The constant weights cropped to the taps that ever read the input, with the pads
    that keep every output where it was; None when every tap does (or the weights are not
    a constant). A dilated convolution wider than its input (DeepLab's atrous rates 24 and
    36 on a 16x16 map) reads only its centre tap: it becomes a 1x1 convolution."""
    weights = ctx.constants.get(w)
    if weights is None:
        return None
    (top, bottom), (left, right) = (
        _live_taps(x_shape[2 + a], w_shape[2 + a], p.stride[a], p.dilation[a], p.pads[a],
                   p.pads[a + 2]) for a in (0, 1))
    if (top, left, bottom, right) == (0, 0, w_shape[2] - 1, w_shape[3] - 1):
        return None
    (dh, dw), (pt, pl, pb, pr) = p.dilation, p.pads
    pads = (pt - top * dh, pl - left * dw, pb - (w_shape[2] - 1 - bottom) * dh,
            pr - (w_shape[3] - 1 - right) * dw)
    if min(pads) < 0:
        return None
    cropped = weights[:, :, top:bottom + 1, left:right + 1]
    dilation = (dh if bottom > top else 1, dw if right > left else 1)
    params = onnx_ops.ConvParams(p.stride, pads, dilation, p.groups)
    return ctx.add_constant(f"{w}/live_taps", cropped), tuple(cropped.shape), params


def _added(ctx: FusionContext, follower: GraphNode, out: str, bias: str | None,
           epilogue: list[str], base: str) -> tuple[str | None, str | None, list[str]] | None:
    """``(bias, residual input or None, epilogue)`` once the ``Add`` ``follower`` of ``out``
    is fused: a per-channel constant folded into the bias, or a residual tensor of the
    output's shape as the ``add`` epilogue; None if it is neither."""
    other = follower.inputs[1] if follower.inputs[0] == out else follower.inputs[0]
    out_shape = ctx.shape(follower.outputs[0])
    vector = (channel_constant(ctx, other, out_shape, 1)
              if out_shape is not None and out_shape == ctx.shape(out) else None)
    if vector is not None and (bias is None or bias in ctx.constants):
        total = vector if bias is None else ctx.constants[bias] + vector
        bias = ctx.add_constant(base, total)
        if "bias" not in epilogue:
            epilogue = ["bias", *epilogue]
        return bias, None, epilogue
    if ("add" not in epilogue and ctx.is_float32(other) and ctx.shape(other) is not None
            and ctx.shape(other) == ctx.shape(out) == out_shape):
        return bias, other, [e for e in epilogue if e == "bias"] + ["add"]
    return None


def _activation(ctx: FusionContext, node: GraphNode, value: str) -> str | None:
    """The conv epilogue activation ``node`` applies to ``value``, if it is one: ``Relu``,
    ``Clip(0, 6)`` or ``Clip(0, inf)`` (another Clip is not), ``HardSwish``, torch's
    ``HardSigmoid`` or ``Gelu``."""
    if node.op_type == "Relu":
        return "relu"
    if (step := activation_step(node)) is not None:
        return step if step in ACTIVATIONS else None
    if node.op_type == "Clip" and node.inputs[0] == value:
        step = clip_step(ctx, node.attrs, node.inputs)
        return step if step in ACTIVATIONS else None
    return None


def _silu_after(ctx: FusionContext, tensor: str) -> list[int] | None:
    """The positions of ``Sigmoid(tensor)`` and ``Mul(tensor, it)`` when they are the only
    readers of ``tensor`` (not a graph output) and may be fused away: a conv's SiLU."""
    if ctx.uses(tensor) != 2 or ctx.is_graph_output(tensor):
        return None
    users = ctx.consumers(tensor)
    if users is None or len(users) != 2:
        return None
    mul = users[-1]
    sigmoid = ctx.producer(other_input(ctx.nodes[mul].inputs, tensor) or "")
    if sigmoid is None or sigmoid not in users:
        return None
    return silu_nodes(ctx, sigmoid, tensor)


def _fold_bn(ctx: FusionContext, bn: GraphNode, weight: str, bias: str | None,
             channels: int) -> tuple[str, str] | None:
    """New (weight, bias) constants with an inference BatchNormalization folded in."""
    params = [ctx.constants.get(t) for t in bn.inputs[1:5]]
    w = ctx.constants.get(weight)
    b = ctx.constants.get(bias) if bias else None
    if w is None or (bias and b is None) or any(
            v is None or v.size != channels for v in params):
        return None
    if any(o and (ctx.uses(o) or ctx.is_graph_output(o)) for o in bn.outputs[1:]):
        return None  # the running statistics outputs are used
    scale, beta, mean, var = (np.asarray(v, dtype=np.float64).reshape(-1) for v in params
                              if v is not None)
    factor = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    # The factor is computed in float64, the weights scaled in float32 (one pass, no
    # float64 copy of large weights).
    new_w = w * factor.astype(np.float32).reshape(-1, 1, 1, 1)
    new_b = ((b.astype(np.float64) if b is not None else 0.0) - mean) * factor + beta
    return (ctx.add_constant(f"{bn.name}/folded_weight", new_w),
            ctx.add_constant(f"{bn.name}/folded_bias", new_b))
