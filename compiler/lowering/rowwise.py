"""Row-wise normalisations onto the ``softmax`` and ``layernorm`` kinds: ``Softmax`` over
the last axis, and ``LayerNormalization`` over the last axis with a residual ``Add`` in
front of it fused in (the pre-norm and post-norm transformer blocks)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.kinds.layernorm import layernorm_op
from tunecache.compiler.kinds.softmax import softmax_op
from tunecache.compiler.lowering import (
    FusionContext,
    other_input,
    register_lowering,
    scalar_constant,
)


def _last_axis(attrs: dict[str, Any], rank: int, default: int) -> bool:
    axis = int(attrs.get("axis", default))
    return (axis + rank if axis < 0 else axis) == rank - 1


@register_lowering("Softmax")
def lower_softmax(ctx: FusionContext, position: int) -> Any:
    node = ctx.nodes[position]
    x = node.inputs[0]
    shape = ctx.shape(x)
    if shape is None or not shape or not ctx.is_float32(x):
        return "softmax is lowered for float32 tensors of known shape"
    # Before opset 13 the axis flattens everything after it; on the last axis both agree.
    if not _last_axis(node.attrs, len(shape), -1 if ctx.opset >= 13 else 1):
        return "softmax over an axis other than the last"
    sig = softmax_op(math.prod(shape[:-1]), shape[-1])
    return ctx.finish(position, [position], sig, [x], node.outputs[0])


@register_lowering("Div", "Mul", "Add")
def lower_scaled_masked_softmax(ctx: FusionContext, position: int) -> Any:
    """``Softmax(x * c + mask)`` (or ``x / c``, or either part alone) over the last axis, as
    attention writes it: one softmax kernel with its ``scale`` and row-grouped ``mask``."""
    node = ctx.nodes[position]
    if len(node.inputs) != 2:
        return None
    fused, scale, mask = [position], None, None
    if node.op_type in ("Div", "Mul"):
        x, factor = _scaled(ctx, node.op_type, node.inputs)
        if x is None or factor is None:
            return None
        scale, current = factor, node.outputs[0]
        nxt = ctx.sole_consumer(current)
        if nxt is not None and ctx.nodes[nxt].op_type == "Add":
            mask = other_input(ctx.nodes[nxt].inputs, current)
            fused.append(nxt)
            current = ctx.nodes[nxt].outputs[0]
    else:
        x, mask = _masked(ctx, node.inputs)
        current = node.outputs[0]
    softmax = ctx.sole_consumer(current)
    shape = ctx.shape(x) if x else None
    if x is None or softmax is None or ctx.nodes[softmax].op_type != "Softmax" or \
            shape is None or not shape or not ctx.is_float32(x) or \
            not _last_axis(ctx.nodes[softmax].attrs, len(shape), -1 if ctx.opset >= 13 else 1):
        return None
    mask_rows = _mask_rows(ctx, mask, shape) if mask else 0
    if mask_rows is None:
        return None
    fused.append(softmax)
    sig = softmax_op(math.prod(shape[:-1]), shape[-1], scale=scale is not None,
                     mask_rows=mask_rows)
    inputs = [x]
    if scale is not None:
        inputs.append(ctx.add_constant(f"{node.name}/scale", np.array([scale], np.float32)))
    if mask:
        inputs.append(mask)
    return ctx.finish(position, fused, sig, inputs, ctx.nodes[softmax].outputs[0])


def _scaled(ctx: FusionContext, op_type: str, inputs: tuple[str, ...]
            ) -> tuple[str | None, float | None]:
    """``(x, factor)`` for ``x / c`` or ``x * c`` (either side for the product)."""
    for x, c in ((inputs[0], inputs[1]), (inputs[1], inputs[0]) if op_type == "Mul" else ("", "")):
        value = scalar_constant(ctx, c) if c else None
        if value is not None and x not in ctx.constants and value != 0.0:
            return x, (1.0 / value if op_type == "Div" else value)
    return None, None


def _masked(ctx: FusionContext, inputs: tuple[str, ...]) -> tuple[str | None, str | None]:
    """``(x, mask)`` of ``x + mask``: x the operand of the result's shape."""
    a, b = inputs
    if ctx.shape(a) is not None and ctx.shape(a) != ctx.shape(b) and \
            ctx.shape(a) == _broadcast_shape(ctx, a, b):
        return a, b
    if ctx.shape(b) is not None and ctx.shape(b) == _broadcast_shape(ctx, a, b):
        return b, a
    return None, None


def _broadcast_shape(ctx: FusionContext, a: str, b: str) -> tuple[int, ...] | None:
    sa, sb = ctx.shape(a), ctx.shape(b)
    if sa is None or sb is None:
        return None
    try:
        return tuple(np.broadcast_shapes(sa, sb))
    except ValueError:
        return None


def _mask_rows(ctx: FusionContext, mask: str, shape: tuple[int, ...]) -> int | None:
    """Rows of a mask that adds one row per group of leading dims (``[batch, 1, 1, keys]``
    over ``[batch, heads, queries, keys]``), or None when it does not broadcast so."""
    m = ctx.shape(mask)
    if m is None or not ctx.is_float32(mask) or len(m) > len(shape) or not m or \
            m[-1] != shape[-1]:
        return None
    m = (1,) * (len(shape) - len(m)) + m
    lead = 0
    while lead < len(shape) - 1 and m[lead] == shape[lead] and m[lead] != 1:
        lead += 1
    if any(d != 1 for d in m[lead:-1]):
        return None
    return math.prod(shape[:lead])


@register_lowering("LayerNormalization")
def lower_layernorm(ctx: FusionContext, position: int) -> Any:
    return _layernorm(ctx, position, None)


@register_lowering("Add")
def lower_residual_layernorm(ctx: FusionContext, position: int) -> Any:
    """``Add(a, b)`` of two same-shape tensors whose only reader is a LayerNormalization."""
    add = ctx.nodes[position]
    norm = ctx.sole_consumer(add.outputs[0])
    if norm is None or ctx.nodes[norm].op_type != "LayerNormalization" or \
            ctx.nodes[norm].inputs[0] != add.outputs[0]:
        return None
    a, b = add.inputs[0], add.inputs[1]
    if a in ctx.constants or b in ctx.constants or ctx.shape(a) != ctx.shape(b) or \
            ctx.shape(a) != ctx.shape(add.outputs[0]):
        return None
    return _layernorm(ctx, norm, (position, a, b))


def _layernorm(ctx: FusionContext, position: int, residual: tuple[int, str, str] | None) -> Any:
    node = ctx.nodes[position]
    x = node.inputs[0] if residual is None else residual[1]
    shape = ctx.shape(node.inputs[0])
    if shape is None or not shape or not ctx.is_float32(node.inputs[0]):
        return "layernorm is lowered for float32 tensors of known shape"
    if not _last_axis(node.attrs, len(shape), -1) or any(node.outputs[1:]):
        return "layer normalisation over more than the last axis, or its statistics wanted"
    n = shape[-1]
    has_bias = len(node.inputs) > 2 and bool(node.inputs[2])
    gamma = beta = None
    if not (_unit_scale(ctx, node.inputs[1]) and not has_bias):
        gamma = _row_constant(ctx, node.inputs[1], n)
        beta = _row_constant(ctx, node.inputs[2], n) if has_bias else None
        if gamma is None or (has_bias and beta is None):
            return "layernorm scale and bias must be constants over the last axis"
    affine = "gamma_beta" if beta is not None else "gamma" if gamma is not None else "none"
    eps = ctx.add_constant(f"{node.name}/epsilon",
                           np.array([node.attrs.get("epsilon", 1e-5)], dtype=np.float32))
    try:
        sig = layernorm_op(math.prod(shape[:-1]), n, affine=affine, residual=residual is not None)
    except OpSignatureError as exc:
        return f"no layernorm signature: {exc}"
    inputs = [x] + ([residual[2]] if residual else []) + ([gamma] if gamma else []) + \
        ([beta] if beta else []) + [eps]
    fused = ([residual[0]] if residual else []) + [position]
    return ctx.finish(fused[0], fused, sig, inputs, node.outputs[0])


def _unit_scale(ctx: FusionContext, name: str) -> bool:
    """Whether ``name`` is a one-element constant 1: a normalisation without its own scale
    (how the group-normalisation rewrite writes one, scaling per channel afterwards)."""
    value = ctx.constants.get(name)
    return value is not None and value.size == 1 and float(value.reshape(-1)[0]) == 1.0


def _row_constant(ctx: FusionContext, name: str, n: int) -> str | None:
    value = ctx.constants.get(name)
    if value is None or value.size not in (1, n):
        return None
    if value.size == n and value.shape == (n,) and value.dtype == np.float32:
        return name
    return ctx.add_constant(f"{name}/row", np.broadcast_to(value.reshape(-1), (n,)))
