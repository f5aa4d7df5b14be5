"""A projection split into pieces along its columns becomes one matmul per piece.

GPT-2's attention projects Q, K and V with one ``[768, 2304]`` matmul (the exported
``Conv1D``) and cuts its output with ``Split`` along the last axis, a numpy copy of every
column. With constant weights (and bias), the same columns come straight out of one
matmul per piece over a slice of the weights, each writing its own tensor: no copy, and
pieces the size of the model's other projections, which a tuned store already knows.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.lowering import StepContext, producers, readers, register_step_pass


@register_step_pass
def split_projection_columns(steps: list[Any], ctx: StepContext) -> list[Any]:
    """Replace ``matmul -> [Reshape keeping the last axis]* -> Split(last axis)`` by one
    matmul per piece when the matmul's weights and bias are constants and every link is read
    by the next one only."""
    reads, writes = readers(steps), producers(steps)
    replaced: dict[int, list[Any]] = {}
    dropped: set[int] = set()
    for position, step in enumerate(steps):
        if getattr(step, "op_type", None) != "Split":
            continue
        found = _projection(step, steps, ctx, reads, writes)
        if found is None or found[0] in replaced:
            continue
        matmul, chain = found
        replaced[matmul] = _pieces(steps[matmul], step, ctx,
                                   tuple(steps[p].name for p in (*chain, position)))
        dropped.update((*chain, position))
    out: list[Any] = []
    for position, step in enumerate(steps):
        if position not in dropped:
            out += replaced.get(position, [step])
    return out


def _projection(split: Any, steps: list[Any], ctx: StepContext, reads: dict[str, list[int]],
                writes: dict[str, int]) -> tuple[int, list[int]] | None:
    """``(matmul position, Reshape positions)`` when ``split`` cuts a constant-weight
    matmul's output along its columns, else None."""
    source = split.inputs[0]
    shape = ctx.shape(source)
    if not shape:
        return None
    axis = int(split.attrs.get("axis", 0))
    if axis not in (-1, len(shape) - 1) or not all(split.outputs):
        return None
    widths = [(ctx.shape(o) or (0,))[-1] for o in split.outputs]
    if sum(widths) != shape[-1] or 0 in widths:
        return None
    chain: list[int] = []
    name = source
    while True:
        position = writes.get(name)
        if position is None or len(reads.get(name, ())) != 1 or ctx.is_graph_output(name):
            return None
        node = steps[position]
        op = getattr(node, "op", None)
        if op is not None:
            return (position, chain) if _splittable(node, ctx, shape[-1]) else None
        before = ctx.shape(node.inputs[0]) if node.op_type == "Reshape" else None
        if not before or before[-1] != shape[-1]:
            return None
        chain.insert(0, position)
        name = node.inputs[0]


def _splittable(node: Any, ctx: StepContext, columns: int) -> bool:
    op = node.op
    constant = all(t in ctx.constants for t in node.inputs[1:])
    return op.kind == "matmul" and op.dim("N") == columns and constant


def _pieces(matmul: Any, split: Any, ctx: StepContext, absorbed: tuple[str, ...]) -> list[Any]:
    """One matmul node per output of ``split``, over its columns of the weights and bias."""
    op = matmul.op
    w_const = ctx.constants[matmul.inputs[1]]
    weights = w_const.reshape(op.arguments()[1].shape)
    b_const = ctx.constants[matmul.inputs[2]] if len(matmul.inputs) > 2 else None
    pieces, start = [], 0
    for i, output in enumerate(split.outputs):
        shape = ctx.shape(output) or ()
        width = shape[-1]
        cols = slice(start, start + width)
        # Views, copied only the first time this model derives them.
        w_cols = weights[cols] if op.trans_b else weights[:, cols]
        inputs = [matmul.inputs[0], ctx.derived_constant(
            f"{matmul.name}/B{i}", ("columns", op.trans_b, start, width), (w_const,),
            partial(np.ascontiguousarray, w_cols))]
        if b_const is not None:
            inputs.append(ctx.derived_constant(
                f"{matmul.name}/bias{i}", ("columns", start, width), (b_const,),
                partial(np.ascontiguousarray, b_const.reshape(-1)[cols])))
        sig = matmul_op(op.dim("M"), width, op.dim("K"), trans_a=op.trans_a,
                        trans_b=op.trans_b, epilogue=op.epilogue, dtype=op.dtype)
        pieces.append(replace(matmul, name=matmul.name if i == 0 else f"{matmul.name}/{i}",
                              nodes=(*matmul.nodes, *absorbed) if i == 0 else matmul.nodes,
                              op=sig, inputs=tuple(inputs), output=output,
                              output_shape=tuple(shape)))
        start += width
    return pieces
