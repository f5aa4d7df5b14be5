"""2-D pooling (``MaxPool``, ``AveragePool``, ``GlobalAveragePool``, ``GlobalMaxPool``, and
``ReduceMean``/``ReduceMax`` over the two spatial axes of an NCHW tensor, as exporters write
global pooling) onto the ``pool2d`` kind, with a following ``Relu`` fused as its epilogue."""

from __future__ import annotations

from typing import Any

from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.kinds.pool2d import global_pool2d_op, pool2d_op
from tunecache.compiler.lowering import (
    FusionContext,
    GraphNode,
    reduced_axes,
    register_lowering,
)
from tunecache.compiler.onnx_ops import resolve_pads
from tunecache.compiler.ops import OpSignature

_MODE = {"MaxPool": "max", "AveragePool": "avg", "GlobalAveragePool": "avg",
         "GlobalMaxPool": "max"}
_GLOBAL_REDUCE = {"ReduceMean": "avg", "ReduceMax": "max"}


@register_lowering(*_GLOBAL_REDUCE)
def lower_global_reduce(ctx: FusionContext, position: int) -> Any:
    """A mean or max over H and W of a float32 NCHW tensor: the global pool (the output
    keeps or drops the two axes; the kernel's [N, C, 1, 1] holds the same elements)."""
    node = ctx.nodes[position]
    x = node.inputs[0]
    shape = ctx.shape(x)
    if shape is None or len(shape) != 4 or not ctx.is_float32(x):
        return "a reduction is lowered as global pooling for float32 NCHW tensors"
    if reduced_axes(ctx, node, 4) != frozenset({2, 3}):
        return "a reduction is lowered as global pooling over axes 2 and 3 only"
    n, c, h, w = shape
    sig = global_pool2d_op(n, c, h, w, mode=_GLOBAL_REDUCE[node.op_type])
    return ctx.finish(position, [position], sig, [x], node.outputs[0])


@register_lowering(*_MODE)
def lower_pool(ctx: FusionContext, position: int) -> Any:
    node = ctx.nodes[position]
    x = node.inputs[0]
    shape = ctx.shape(x)
    if shape is None or len(shape) != 4 or not ctx.is_float32(x):
        return "pooling is lowered for 2-D float32 NCHW tensors"
    if any(node.outputs[1:]):
        return "MaxPool's indices output is wanted"
    fused, out = [position], node.outputs[0]
    follower = ctx.sole_consumer(out)
    relu = follower is not None and ctx.nodes[follower].op_type == "Relu"
    if relu and follower is not None:
        fused.append(follower)
        out = ctx.nodes[follower].outputs[0]
    try:
        sig = _signature(node, shape, ("relu",) if relu else ())
    except OpSignatureError as exc:
        return f"no pool2d signature: {exc}"
    if isinstance(sig, str):
        return sig
    return ctx.finish(position, fused, sig, [x], out)


def _signature(node: GraphNode, shape: tuple[int, ...], epilogue: tuple[str, ...]
               ) -> OpSignature | str:
    n, c, h, w = shape
    mode = _MODE[node.op_type]
    if node.op_type.startswith("Global"):
        return global_pool2d_op(n, c, h, w, mode=mode, epilogue=epilogue)
    attrs = node.attrs
    if int(attrs.get("storage_order", 0)):
        return "storage_order=1"
    kernel = tuple(int(k) for k in attrs["kernel_shape"])
    strides = tuple(int(s) for s in attrs.get("strides", (1, 1)))
    dilations = tuple(int(d) for d in attrs.get("dilations", (1, 1)))
    pads = resolve_pads(str(attrs.get("auto_pad", "NOTSET")), (h, w), kernel, strides,
                        dilations, attrs.get("pads"))
    return pool2d_op(n, c, h, w, kernel[0], kernel[1], mode=mode,
                     stride=(strides[0], strides[1]), dilation=(dilations[0], dilations[1]),
                     pads=(pads[0], pads[1], pads[2], pads[3]),
                     ceil_mode=bool(attrs.get("ceil_mode", 0)),
                     count_include_pad=bool(attrs.get("count_include_pad", 0)) and mode == "avg",
                     epilogue=epilogue)
