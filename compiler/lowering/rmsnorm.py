"""RMSNorm as the exporters write it, onto the ``layernorm`` kind with ``norm=rms``.

``y = x / sqrt(mean(x**2) + eps) * weight`` over the last axis (Llama's norm) comes out of
torch.onnx as a chain of primitive nodes::

    Pow(x, 2) -> ReduceMean(last axis, keepdims) -> Add(eps) -> Sqrt
        -> Div(1, .) or Reciprocal -> Mul(x, .)      (or Div(x, .) straight from the Sqrt)
        -> [Cast to float] -> [Mul(., weight) -> [Add(., bias)]]

with the operands of ``Add`` and ``Mul`` in either order. It becomes one kernel when ``x``
is float32 of known shape, ``eps`` a scalar constant, the weight and bias (if any) constants
along the last axis, and every link but ``x`` read by its successor only. ``x`` is usually
also the residual stream, so a residual ``Add`` that produces it stays out of the kernel.
A LayerNorm written out in nodes (``x = t - mean t`` first) becomes the RMSNorm of its
centred rows, the mean and the ``Sub`` left in front. Opset 23's ``RMSNormalization`` node
over the last axis, with a constant scale along it, is the same kernel.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tunecache.compiler import onnx_ops
from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.kinds.layernorm import layernorm_op
from tunecache.compiler.lowering import (
    FusionContext,
    GraphNode,
    other_input,
    reduced_axes,
    register_lowering,
    scalar_constant,
)


@register_lowering("Pow")
def lower_rmsnorm(ctx: FusionContext, position: int) -> Any:
    """The RMSNorm chain starting at ``Pow(x, 2)``: None when the ``Pow`` does not start
    one, a reason when the chain is there but cannot be one kernel."""
    node = ctx.nodes[position]
    x = node.inputs[0]
    if len(node.inputs) != 2 or x in ctx.constants or \
            scalar_constant(ctx, node.inputs[1]) != 2.0:
        return None
    mean = _follow(ctx, node.outputs[0], "ReduceMean")
    if mean is None:
        return None
    shape = ctx.shape(x)
    if shape is None or not shape or not ctx.is_float32(x):
        return "RMSNorm is lowered for float32 tensors of known shape"
    if not _mean_over_last_axis(ctx, ctx.nodes[mean], shape):
        return "RMSNorm's mean must be over the last axis only, its dimension kept"
    fused = [position, mean]
    statistic = ctx.nodes[mean].outputs[0]
    add = _follow(ctx, statistic, "Add")
    eps = scalar_constant(ctx, other_input(ctx.nodes[add].inputs, statistic)) \
        if add is not None else None
    sqrt = _follow(ctx, ctx.nodes[add].outputs[0], "Sqrt") if add is not None else None
    if add is None or eps is None or sqrt is None:
        return "RMSNorm needs sqrt(mean + eps) with eps a scalar constant"
    fused += [add, sqrt]
    scaled = _scaled(ctx, x, ctx.nodes[sqrt].outputs[0])
    if scaled is None:
        return "RMSNorm's mean is not used as x / sqrt(mean + eps)"
    fused += scaled
    output = ctx.nodes[fused[-1]].outputs[0]
    if ctx.shape(output) != shape:
        return "RMSNorm's output does not have the shape of its input"
    cast = ctx.sole_consumer(output)
    if cast is not None and _is_float_cast(ctx.nodes[cast]):
        fused.append(cast)
        output = ctx.nodes[cast].outputs[0]
    gamma, output = _row_operand(ctx, "Mul", output, shape, fused)
    beta, output = _row_operand(ctx, "Add", output, shape, fused) if gamma else (None, output)
    affine = "gamma_beta" if beta else "gamma" if gamma else "none"
    try:
        sig = layernorm_op(math.prod(shape[:-1]), shape[-1], norm="rms", affine=affine)
    except OpSignatureError as exc:
        return f"no layernorm signature: {exc}"
    epsilon = ctx.add_constant(f"{node.name}/epsilon", np.array([eps], dtype=np.float32))
    inputs = [x] + [t for t in (gamma, beta) if t] + [epsilon]
    return ctx.finish(position, fused, sig, inputs, output)


@register_lowering("RMSNormalization")
def lower_rmsnorm_node(ctx: FusionContext, position: int) -> Any:
    """Opset 23's ``RMSNormalization`` over the last axis (float32 statistics), its scale a
    constant along that axis."""
    node = ctx.nodes[position]
    x = node.inputs[0]
    shape = ctx.shape(x)
    if shape is None or not shape or not ctx.is_float32(x):
        return "RMSNorm is lowered for float32 tensors of known shape"
    if int(node.attrs.get("axis", -1)) not in (-1, len(shape) - 1) or \
            int(node.attrs.get("stash_type", 1)) != 1:
        return "RMSNormalization over more than the last axis, or in another precision"
    gamma = _weight(ctx, node.inputs[1], shape)
    if gamma is None:
        return "RMSNormalization's scale must be a constant along the last axis"
    try:
        sig = layernorm_op(math.prod(shape[:-1]), shape[-1], norm="rms", affine="gamma")
    except OpSignatureError as exc:
        return f"no layernorm signature: {exc}"
    epsilon = ctx.add_constant(f"{node.name}/epsilon", np.array(
        [node.attrs.get("epsilon", 1e-5)], dtype=np.float32))
    return ctx.finish(position, [position], sig, [x, gamma, epsilon], node.outputs[0])


def _follow(ctx: FusionContext, tensor: str, op_type: str) -> int | None:
    """The position of ``tensor``'s only reader when it is an ``op_type`` node."""
    reader = ctx.sole_consumer(tensor)
    return reader if reader is not None and ctx.nodes[reader].op_type == op_type else None


def _mean_over_last_axis(ctx: FusionContext, node: GraphNode, shape: tuple[int, ...]) -> bool:
    """Whether a ``ReduceMean`` averages the last axis only and keeps it (axes from the
    attribute before opset 18, from the second input since)."""
    if int(node.attrs.get("keepdims", 1)) != 1:
        return False
    return reduced_axes(ctx, node, len(shape)) == frozenset({len(shape) - 1}) and \
        ctx.shape(node.outputs[0]) == (*shape[:-1], 1)


def _scaled(ctx: FusionContext, x: str, root: str) -> list[int] | None:
    """The positions turning ``root = sqrt(mean + eps)`` into ``x / root``: ``Div(x, root)``,
    or ``Mul(x, 1 / root)`` with ``Reciprocal(root)`` or ``Div(1, root)``."""
    reader = ctx.sole_consumer(root)
    if reader is None:
        return None
    node = ctx.nodes[reader]
    if node.op_type == "Div" and node.inputs == (x, root):
        return [reader]
    inverse = node.op_type == "Reciprocal" or (
        node.op_type == "Div" and len(node.inputs) == 2 and node.inputs[1] == root
        and scalar_constant(ctx, node.inputs[0]) == 1.0)
    if not inverse:
        return None
    mul = _follow(ctx, node.outputs[0], "Mul")
    if mul is None or other_input(ctx.nodes[mul].inputs, node.outputs[0]) != x:
        return None
    return [reader, mul]


def _row_operand(ctx: FusionContext, op_type: str, tensor: str, shape: tuple[int, ...],
                 fused: list[int]) -> tuple[str | None, str]:
    """When ``tensor``'s only reader is ``op_type`` with a constant along the last axis
    (the weight ``Mul``, or a bias ``Add`` after it): that constant as ``[N]``, the reader
    appended to ``fused``, and its output. Else ``(None, tensor)``."""
    reader = _follow(ctx, tensor, op_type)
    if reader is None or ctx.shape(ctx.nodes[reader].outputs[0]) != shape:
        return None, tensor
    row = _weight(ctx, other_input(ctx.nodes[reader].inputs, tensor), shape)
    if row is None:
        return None, tensor
    fused.append(reader)
    return row, ctx.nodes[reader].outputs[0]


def _is_float_cast(node: GraphNode) -> bool:
    """A ``Cast`` to float32 (of the float32 norm: a no-op)."""
    return node.op_type == "Cast" and onnx_ops.ONNX_DTYPES.get(int(node.attrs.get("to", 0))) == np.float32


def _weight(ctx: FusionContext, name: str | None, shape: tuple[int, ...]) -> str | None:
    """A float32 constant ``[N]`` for a constant that scales along the last axis only."""
    value = ctx.constants.get(name) if name else None
    n = shape[-1]
    if value is None or value.dtype != np.float32 or value.ndim > len(shape) or \
            any(d != 1 for d in value.shape[:-1]) or value.size not in (1, n):
        return None
    if value.shape == (n,):
        return name
    return ctx.add_constant(f"{name}/row", np.broadcast_to(value.reshape(-1), (n,)))
