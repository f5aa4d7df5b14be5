"""Rotary position embeddings as the exporters write them, onto the ``rotary`` kind.

Llama's ``x * cos + rotate_half(x) * sin`` comes out of torch.onnx (TorchScript and dynamo
alike) as primitive nodes, ``h`` being half the last dimension ``D``::

    lo = Slice(x, 0, h, last axis)        hi = Slice(x, h, >= D, last axis)
    rot = Concat(Neg(hi), lo, last axis)
    y = Add(Mul(x, cos), Mul(rot, sin))   (operands of Mul and Add in either order)

It becomes one kernel when ``x`` is float32 of known shape, every link is read by its
successor only (``x`` itself feeds the two Slices and the first Mul), and ``cos`` and
``sin`` are float32 constants that broadcast to ``x`` (e.g. ``[1, 1, S, D]`` or ``[S, D]`` over
``x[B, H, S, D]``): they are re-laid out as ``[S, D]`` tables, ``S`` the rows of ``x`` from
the first axis along which a table varies (the positions of ``[B, H, S, D]``; tables that
vary over the batch too give a table row per row of ``x``). The first of
the pattern's nodes in execution order starts it: one of the Slices or ``Mul(x, cos)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.kinds.rotary import rotary_op
from tunecache.compiler.lowering import FusionContext, GraphNode, other_input, register_lowering


@dataclass(frozen=True)
class _Match:
    """The pattern's nodes (positions) and tensors."""

    x: str
    cos: str
    sin: str
    fused: tuple[int, ...]
    output: str


@register_lowering("Slice", "Mul")
def lower_rotary(ctx: FusionContext, position: int) -> Any:
    """The rotary pattern whose first node is at ``position``: None when that node does not
    start one, a reason when the pattern is there but cannot be one kernel."""
    add = _add_from(ctx, position)
    if add is None:
        return None
    match = _match(ctx, add)
    if match is None or min(match.fused) != position:
        return None
    shape = ctx.shape(match.x)
    if shape is None or len(shape) < 2 or not ctx.is_float32(match.x):
        return "rotary embedding is lowered for float32 tensors of known shape"
    if shape[-1] % 2 or ctx.shape(match.output) != shape:
        return "rotary embedding needs an even last axis and an output of the input's shape"
    tables = _tables(ctx, match, shape)
    if isinstance(tables, str):
        return tables
    cos, sin = tables
    try:
        sig = rotary_op(math.prod(shape[:-1]), shape[-1], cos.shape[0])
    except OpSignatureError as exc:
        return f"no rotary signature: {exc}"
    base = ctx.nodes[add].name
    inputs = [match.x, ctx.add_constant(f"{base}/cos", cos), ctx.add_constant(f"{base}/sin", sin)]
    return ctx.finish(position, sorted(match.fused), sig, inputs, match.output)


def _follow(ctx: FusionContext, tensor: str, op_type: str) -> int | None:
    """The position of ``tensor``'s only reader when it is an ``op_type`` node."""
    reader = ctx.sole_consumer(tensor)
    return reader if reader is not None and ctx.nodes[reader].op_type == op_type else None


def _add_from(ctx: FusionContext, position: int) -> int | None:
    """The pattern's final ``Add`` reached from a node that may start it: a Slice through
    ``[Neg] -> Concat -> Mul -> Add``, or ``Mul(x, cos) -> Add``."""
    node = ctx.nodes[position]
    tensor = node.outputs[0]
    if node.op_type == "Slice":
        neg = _follow(ctx, tensor, "Neg")
        if neg is not None:
            tensor = ctx.nodes[neg].outputs[0]
        concat = _follow(ctx, tensor, "Concat")
        mul = _follow(ctx, ctx.nodes[concat].outputs[0], "Mul") if concat is not None else None
        if mul is None:
            return None
        tensor = ctx.nodes[mul].outputs[0]
    elif len(node.inputs) != 2 or not any(t in ctx.constants for t in node.inputs):
        return None
    return _follow(ctx, tensor, "Add")


def _producer(ctx: FusionContext, tensor: str | None, op_type: str) -> int | None:
    position = ctx.producer(tensor) if tensor else None
    return position if position is not None and ctx.nodes[position].op_type == op_type else None


def _match(ctx: FusionContext, add: int) -> _Match | None:
    """The whole pattern ending at the ``Add`` at ``add``, or None."""
    node = ctx.nodes[add]
    if len(node.inputs) != 2:
        return None
    for first, second in (node.inputs, node.inputs[::-1]):
        found = _match_terms(ctx, add, first, second)
        if found is not None:
            return found
    return None


def _match_terms(ctx: FusionContext, add: int, cos_term: str, sin_term: str) -> _Match | None:
    """``cos_term = Mul(x, cos)`` and ``sin_term = Mul(rotate_half(x), sin)``, or None."""
    mul_cos, mul_sin = _producer(ctx, cos_term, "Mul"), _producer(ctx, sin_term, "Mul")
    if mul_cos is None or mul_sin is None or ctx.sole_consumer(cos_term) != add or \
            ctx.sole_consumer(sin_term) != add:
        return None
    for rot in ctx.nodes[mul_sin].inputs:
        concat = _producer(ctx, rot, "Concat")
        if concat is None or ctx.sole_consumer(rot) != mul_sin:
            continue
        sin = other_input(ctx.nodes[mul_sin].inputs, rot)
        halves = _rotate_half(ctx, concat)
        if halves is None or sin not in ctx.constants:
            continue
        x, nodes = halves
        cos = other_input(ctx.nodes[mul_cos].inputs, x)
        if cos is None or cos not in ctx.constants or sin is None:
            continue
        fused = (*nodes, concat, mul_sin, mul_cos, add)
        return _Match(x, cos, sin, fused, ctx.nodes[add].outputs[0])
    return None


def _rotate_half(ctx: FusionContext, position: int) -> tuple[str, tuple[int, ...]] | None:
    """``Concat(Neg(x[..., h:]), x[..., :h])`` on the last axis at ``position``: ``x`` and
    the positions of the two Slices and the Neg, or None."""
    concat = ctx.nodes[position]
    if len(concat.inputs) != 2:
        return None
    neg = _producer(ctx, concat.inputs[0], "Neg")
    lo = _producer(ctx, concat.inputs[1], "Slice")
    if neg is None or lo is None or ctx.sole_consumer(concat.inputs[0]) != position or \
            ctx.sole_consumer(concat.inputs[1]) != position:
        return None
    hi = _producer(ctx, ctx.nodes[neg].inputs[0], "Slice")
    if hi is None or ctx.sole_consumer(ctx.nodes[neg].inputs[0]) != neg:
        return None
    x = ctx.nodes[lo].inputs[0]
    shape = ctx.shape(x)
    if ctx.nodes[hi].inputs[0] != x or shape is None or not shape or shape[-1] % 2:
        return None
    rank, d = len(shape), shape[-1]
    axis = int(concat.attrs.get("axis", 0))
    if axis not in (-1, rank - 1):
        return None
    if _slice_range(ctx, ctx.nodes[lo], rank, d) != (0, d // 2) or \
            _slice_range(ctx, ctx.nodes[hi], rank, d) != (d // 2, d):
        return None
    return x, (lo, hi, neg)


def _slice_range(ctx: FusionContext, node: GraphNode, rank: int, d: int) -> tuple[int, int] | None:
    """The ``[start, end)`` a Slice takes of the last axis (of size ``d``), clamped; None
    when it slices another axis too, steps, or its bounds are not constants."""
    def values(index: int, attr: str) -> list[int] | None:
        if len(node.inputs) > index and node.inputs[index]:
            value = ctx.constants.get(node.inputs[index])
            return None if value is None else [int(v) for v in value.reshape(-1)]
        found = node.attrs.get(attr)
        return None if found is None else [int(v) for v in found]

    starts, ends = values(1, "starts"), values(2, "ends")
    axes = values(3, "axes") or list(range(len(starts or ())))
    steps = values(4, "steps") or [1] * len(axes)
    if starts is None or ends is None or len(starts) != 1 or len(ends) != 1 or \
            len(axes) != 1 or steps != [1] or axes[0] not in (-1, rank - 1):
        return None

    def clamp(v: int) -> int:
        return min(max(v + d if v < 0 else v, 0), d)

    return clamp(starts[0]), clamp(ends[0])


def _tables(ctx: FusionContext, match: _Match, shape: tuple[int, ...]
            ) -> tuple[np.ndarray, np.ndarray] | str:
    """The cos and sin constants as ``[S, D]`` tables over the same ``S``, or why not."""
    values = [ctx.constants[match.cos], ctx.constants[match.sin]]
    padded = []
    for value in values:
        if value.dtype != np.float32 or value.ndim > len(shape) or not all(
                v in (1, s) for v, s in zip(value.shape[::-1], shape[::-1], strict=False)):
            return "rotary cos/sin must be float32 constants that broadcast to the input"
        padded.append(value.reshape((1,) * (len(shape) - value.ndim) + value.shape))
    # Neither table varies before ``first``; a table varying over the batch or heads makes
    # ``S`` cover those axes too (tables as large as x, still exact).
    first = min(_first_varying(v) for v in padded)
    rows = math.prod(shape[first:-1])
    tables = tuple(
        np.ascontiguousarray(np.broadcast_to(v[(0,) * first], shape[first:]).reshape(rows, -1))
        for v in padded)
    return tables[0], tables[1]


def _first_varying(value: np.ndarray) -> int:
    """The first axis (before the last) along which ``value`` is not constant."""
    for axis in range(value.ndim - 1):
        if value.shape[axis] > 1 and not (value == value.take([0], axis=axis)).all():
            return axis
    return value.ndim - 1
