"""Scaled-dot-product attention as the exporters write it, onto the ``attention`` kind.

torch.onnx (TorchScript and dynamo alike) writes ``scaled_dot_product_attention`` and the
eager attention of transformers models as primitive nodes, ``q[.., M, D]``, ``k``, ``v[.., N,
Dv]`` with the same batch dims (batch x heads)::

    kt = swap of k's last two axes      Transpose(k), Transpose(perm) of the pre-head layout,
                                        or Reshape -> Transpose(0, 2, 1) -> Reshape
    s = MatMul(q * c1, kt * c2) * c3    each scaling optional: Mul or Div by a scalar constant
    s = s + mask                        optional, the mask broadcasting to s
    p = Softmax(s)                      over the last axis
    p = Where(IsNaN(p), 0, p)           optional (SDPA's fully masked rows)
    y = MatMul(p, v)

It becomes one kernel when every link is read by its successor only (nothing needed
elsewhere is fused away), the tensors are float32 of known shape and the batch dims of
``q``, ``kt``, ``v`` and the scores agree (no broadcast). The scalings multiply into one
scale: ``scale=default`` when it is ``1/sqrt(D)``, else a ``scale[1]`` constant. The mask:

* none, or a constant of zeros: ``mask=none``;
* a constant ``[M, N]`` lower triangle (bottom-right aligned; ``-1e4`` or lower above it):
  ``mask=causal``;
* ``[b.., 1, N]`` (BERT's ``[batch, 1, 1, N]``): ``mask=padding``;
* ``[b.., M, N]`` (the ``[batch, 1, M, N]`` masks exporters build at run time from the
  padding mask and the causal one): ``mask=full``;

``b..`` being leading batch dims of the scores followed by ones (``mask_rows`` is their
product). A K reached through a Transpose that is not a plain swap of the last two axes (the
TorchScript export's ``perm=(0, 2, 3, 1)`` of the ``[b, N, h, D]`` projection) is laid out by
a helper ``Transpose`` before the kernel. The first of the pattern's nodes in execution order
starts it: the MatMul, a scaling Mul/Div, or a node of K's transposition.

A row whose every key is masked with ``-inf`` gives zeros, as the ``Where(IsNaN)`` form
computes; without that wrapper ONNX would give NaN for such a row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.kinds.attention import attention_op, causal_keep, value_dim
from tunecache.compiler.lowering import (
    FusionContext,
    GraphNode,
    StepContext,
    other_input,
    producers,
    readers,
    register_lowering,
    register_step_pass,
    scalar_constant,
)

# Fill values at or below this hide a key as surely as -inf: exp() of it is 0 in float32.
_HIDDEN = -1e4
# How far a product of scalings may be from 1/sqrt(D) and still be the default scale.
_SCALE_RTOL = 1e-6
_MAX_LEAD = 6


@dataclass(frozen=True)
class _Operand:
    """A MatMul operand traced back to the tensor the kernel reads: the nodes passed on the
    way (fused), the scalings met, and the permutation a helper Transpose must apply to
    ``tensor`` (None: read it as it is)."""

    tensor: str
    nodes: tuple[int, ...]
    scale: float
    perm: tuple[int, ...] | None = None


@dataclass(frozen=True)
class _Match:
    """One attention pattern: Q, K, V, the mask, the scale and the nodes it spans."""

    q: _Operand
    k: _Operand
    v: str
    mask: str | None
    scale: float
    fused: tuple[int, ...]
    scores: tuple[int, ...]
    output: str


@register_lowering("MatMul", "Mul", "Div", "Transpose", "Reshape")
def lower_attention(ctx: FusionContext, position: int) -> Any:
    """The attention pattern whose first node is at ``position``: None when that node does
    not start one, a reason when the pattern is there but cannot be one kernel."""
    scores_mm = _scores_matmul(ctx, position)
    if scores_mm is None:
        return None
    match = _match(ctx, scores_mm)
    if match is None or min(match.fused) != position:
        return None
    return _lower(ctx, match)


def _lower(ctx: FusionContext, match: _Match) -> Any:
    """The kernel for ``match``, or why there is none."""
    batch = match.scores[:-2]
    b, m, n = math.prod(batch), match.scores[-2], match.scores[-1]
    q_shape, v_shape = ctx.shape(match.q.tensor), ctx.shape(match.v)
    k_shape = _laid_out_shape(ctx, match.k)
    tensors = [match.q.tensor, match.k.tensor, match.v] + ([match.mask] if match.mask else [])
    if q_shape is None or k_shape is None or v_shape is None or \
            not all(ctx.is_float32(t) for t in tensors):
        return "attention is lowered for float32 tensors of known shape"
    d, dv = q_shape[-1], v_shape[-1]
    if k_shape[-2:] != (n, d) or math.prod(k_shape) != b * n * d or \
            v_shape[-2] != n or math.prod(v_shape) != b * n * dv:
        return f"K {list(k_shape)} or V {list(v_shape)} do not match the scores {list(match.scores)}"
    mask = _mask_mode(ctx, match.mask, match.scores)
    if mask is None:
        return f"mask {list(ctx.shape(match.mask or '') or ())} does not broadcast as rows of " \
               "the batch dims"
    mode, rows = mask
    default = abs(match.scale * math.sqrt(d) - 1.0) <= _SCALE_RTOL
    try:
        sig = attention_op(b, m, n, d, Dv=dv, mask=mode, mask_rows=rows,
                           scale="default" if default else "input")
    except OpSignatureError as exc:
        return f"no attention signature: {exc}"
    k = match.k.tensor
    if match.k.perm is not None:
        k = ctx.add_node("Transpose", [k], {"perm": match.k.perm}, k_shape)
    mm = match.fused[0]
    inputs = [match.q.tensor, k, match.v]
    if not default:
        inputs.append(ctx.add_constant(f"{ctx.nodes[mm].name}/scale",
                                       np.array([match.scale], np.float32)))
    if mode in ("padding", "full") and match.mask:
        inputs.append(match.mask)
    # Named after the scores MatMul; placed at the final MatMul, the last of the nodes.
    return ctx.finish(mm, [mm, *sorted(p for p in match.fused if p != mm)], sig, inputs,
                      match.output)


def _scores_matmul(ctx: FusionContext, position: int) -> int | None:
    """The MatMul reached from ``position`` through the only readers of Reshape, Transpose,
    Mul and Div nodes: where a pattern starting there would compute its scores."""
    for _ in range(_MAX_LEAD):
        node = ctx.nodes[position]
        if node.op_type == "MatMul":
            return position
        if node.op_type not in ("Reshape", "Transpose", "Mul", "Div"):
            return None
        reader = ctx.sole_consumer(node.outputs[0])
        if reader is None:
            return None
        position = reader
    return None


def _match(ctx: FusionContext, mm: int) -> _Match | None:
    """The pattern around the scores MatMul at ``mm``, or None."""
    node = ctx.nodes[mm]
    scores = ctx.shape(node.outputs[0])
    if scores is None or len(scores) < 2 or len(node.inputs) != 2:
        return None
    a_shape, b_shape = ctx.shape(node.inputs[0]), ctx.shape(node.inputs[1])
    if a_shape is None or b_shape is None or a_shape[:-2] != scores[:-2] or \
            b_shape[:-2] != scores[:-2]:
        return None
    tail = _tail(ctx, node.outputs[0], scores)
    if tail is None:
        return None
    fused, scale, mask, v, output = tail
    q = _scaled_operand(ctx, node.inputs[0], mm)
    k = _key_operand(ctx, node.inputs[1], mm, len(scores))
    if ctx.shape(output) is None or ctx.shape(v) is None or \
            (ctx.shape(v) or ())[:-2] != scores[:-2]:
        return None
    return _Match(q, k, v, mask, scale * q.scale * k.scale,
                  (mm, *fused, *q.nodes, *k.nodes), scores, output)


def _tail(ctx: FusionContext, current: str, scores: tuple[int, ...]
          ) -> tuple[list[int], float, str | None, str, str] | None:
    """After the scores: ``(nodes, scale, mask, v, output)`` of ``[* c] [+ mask] Softmax
    [Where(IsNaN)] MatMul(., v)``, or None."""
    fused: list[int] = []
    scale = 1.0
    mask: str | None = None
    nxt = ctx.sole_consumer(current)
    if nxt is not None and ctx.nodes[nxt].op_type in ("Mul", "Div"):
        factor = _factor(ctx, ctx.nodes[nxt], current)
        if factor is None:
            return None
        fused.append(nxt)
        scale, current = factor, ctx.nodes[nxt].outputs[0]
        nxt = ctx.sole_consumer(current)
    if nxt is not None and ctx.nodes[nxt].op_type == "Add":
        mask = other_input(ctx.nodes[nxt].inputs, current)
        if mask is None or ctx.shape(ctx.nodes[nxt].outputs[0]) != scores:
            return None
        fused.append(nxt)
        current = ctx.nodes[nxt].outputs[0]
        nxt = ctx.sole_consumer(current)
    if nxt is None or not _last_axis_softmax(ctx, ctx.nodes[nxt], len(scores)):
        return None
    fused.append(nxt)
    current = ctx.nodes[nxt].outputs[0]
    wrapper = _nan_wrapper(ctx, current)
    if wrapper is not None:
        fused += wrapper
        current = ctx.nodes[wrapper[-1]].outputs[0]
    nxt = ctx.sole_consumer(current)
    if nxt is None or ctx.nodes[nxt].op_type != "MatMul" or ctx.nodes[nxt].inputs[0] != current:
        return None
    fused.append(nxt)
    return fused, scale, mask, ctx.nodes[nxt].inputs[1], ctx.nodes[nxt].outputs[0]


def _factor(ctx: FusionContext, node: GraphNode, x: str) -> float | None:
    """The factor ``node`` scales ``x`` by: ``x * c``, ``c * x`` or ``x / c`` for a scalar
    constant ``c`` whose result keeps ``x``'s shape; None otherwise."""
    if len(node.inputs) != 2 or ctx.shape(node.outputs[0]) != ctx.shape(x):
        return None
    if node.op_type == "Div":
        value = scalar_constant(ctx, node.inputs[1]) if node.inputs[0] == x else None
        return 1.0 / value if value else None
    if node.op_type == "Mul":
        return scalar_constant(ctx, other_input(node.inputs, x))
    return None


def _last_axis_softmax(ctx: FusionContext, node: GraphNode, rank: int) -> bool:
    if node.op_type != "Softmax":
        return False
    # Before opset 13 the axis flattens everything after it; on the last axis both agree.
    axis = int(node.attrs.get("axis", -1 if ctx.opset >= 13 else 1))
    return (axis + rank if axis < 0 else axis) == rank - 1


def _nan_wrapper(ctx: FusionContext, probs: str) -> list[int] | None:
    """The positions of ``IsNaN(probs)`` and ``Where(it, 0, probs)`` when they are the only
    readers of ``probs``, or None."""
    readers = ctx.consumers(probs)
    if readers is None or len(readers) != 2:
        return None
    isnan, where = readers
    if ctx.nodes[isnan].op_type != "IsNaN":
        isnan, where = where, isnan
    flag = ctx.nodes[isnan].outputs[0]
    w = ctx.nodes[where]
    if ctx.nodes[isnan].op_type != "IsNaN" or w.op_type != "Where" or \
            w.inputs != (flag, w.inputs[1], probs) or scalar_constant(ctx, w.inputs[1]) != 0.0 \
            or ctx.sole_consumer(flag) != where or ctx.shape(w.outputs[0]) != ctx.shape(probs):
        return None
    return [isnan, where]


def _produced_for(ctx: FusionContext, tensor: str, reader: int) -> int | None:
    """The position of ``tensor``'s producer when ``reader`` is its only reader."""
    producer = ctx.producer(tensor)
    return producer if producer is not None and ctx.sole_consumer(tensor) == reader else None


def _scaled_operand(ctx: FusionContext, tensor: str, reader: int) -> _Operand:
    """``tensor`` read by ``reader``, traced back through scalings by constants."""
    nodes: list[int] = []
    scale = 1.0
    while True:
        producer = _produced_for(ctx, tensor, reader)
        if producer is None:
            break
        node = ctx.nodes[producer]
        x = next((t for t in node.inputs if t not in ctx.constants), None)
        factor = _factor(ctx, node, x) if x is not None else None
        if factor is None or x is None:
            break
        nodes.append(producer)
        scale *= factor
        tensor, reader = x, producer
    return _Operand(tensor, tuple(nodes), scale)


def _key_operand(ctx: FusionContext, kt: str, reader: int, rank: int) -> _Operand:
    """K laid out ``[.., N, D]`` from the scores MatMul's ``kt`` (``[.., D, N]``): through
    scalings, Reshapes that keep the last two axes, and the Transpose swapping them (a
    Transpose with another permutation, or none, leaves a helper Transpose to add)."""
    scaled = _scaled_operand(ctx, kt, reader)
    nodes, tensor, reader = list(scaled.nodes), scaled.tensor, (
        scaled.nodes[-1] if scaled.nodes else reader)
    while True:
        producer = _produced_for(ctx, tensor, reader)
        if producer is None or ctx.nodes[producer].op_type != "Reshape" or \
                not _batch_reshape(ctx, ctx.nodes[producer]):
            break
        nodes.append(producer)
        tensor, reader = ctx.nodes[producer].inputs[0], producer
    producer = _produced_for(ctx, tensor, reader)
    shape = ctx.shape(tensor) or ()
    if producer is None or ctx.nodes[producer].op_type != "Transpose" or len(shape) < 2:
        swap = (*range(len(shape) - 2), len(shape) - 1, len(shape) - 2)
        return _Operand(tensor, tuple(nodes), scaled.scale, swap)
    node = ctx.nodes[producer]
    source = node.inputs[0]
    perm = tuple(int(p) for p in node.attrs.get("perm", range(len(shape))[::-1]))
    undo = (*perm[:-2], perm[-1], perm[-2])
    nodes.append(producer)
    if undo != tuple(range(len(perm))):
        return _Operand(source, tuple(nodes), scaled.scale, undo)
    # The dynamo export swaps over merged batch dims: [b, h, N, D] -> [b*h, N, D] first.
    merged = _produced_for(ctx, source, producer)
    if merged is not None and len(shape) != rank and ctx.nodes[merged].op_type == "Reshape" \
            and _batch_reshape(ctx, ctx.nodes[merged]):
        nodes.append(merged)
        source = ctx.nodes[merged].inputs[0]
    return _Operand(source, tuple(nodes), scaled.scale)


def _batch_reshape(ctx: FusionContext, node: GraphNode) -> bool:
    """Whether a Reshape only regroups the batch dims (the last two axes stay)."""
    before, after = ctx.shape(node.inputs[0]), ctx.shape(node.outputs[0])
    return before is not None and after is not None and len(before) >= 2 and \
        len(after) >= 2 and before[-2:] == after[-2:]


def _laid_out_shape(ctx: FusionContext, k: _Operand) -> tuple[int, ...] | None:
    shape = ctx.shape(k.tensor)
    if shape is None or k.perm is None:
        return shape
    return tuple(shape[p] for p in k.perm)


def _mask_mode(ctx: FusionContext, mask: str | None, scores: tuple[int, ...]
               ) -> tuple[str, int | None] | None:
    """``(mask mode, mask_rows)`` for an additive ``mask`` over ``scores``, or None when it
    does not broadcast as rows (or matrices) of leading batch dims."""
    if mask is None:
        return "none", None
    value = ctx.constants.get(mask)
    if value is not None and not np.any(value):
        return "none", None
    if value is not None and _causal(value, scores):
        return "causal", None
    shape = ctx.shape(mask)
    if shape is None or len(shape) > len(scores) or not shape or shape[-1] != scores[-1]:
        return None
    shape = (1,) * (len(scores) - len(shape)) + shape
    if shape[-2] not in (1, scores[-2]):
        return None
    lead = 0
    while lead < len(scores) - 2 and shape[lead] == scores[lead] and shape[lead] != 1:
        lead += 1
    if any(d != 1 for d in shape[lead:-2]):
        return None
    full = shape[-2] != 1 and scores[-2] != 1
    return ("full" if full else "padding"), math.prod(scores[:lead])


def _causal(value: np.ndarray, scores: tuple[int, ...]) -> bool:
    """Whether a constant mask is the same bottom-right aligned lower triangle for every
    batch item: 0 on and below it, hidden above."""
    m, n = scores[-2], scores[-1]
    if value.ndim < 2 or value.shape[-2:] != (m, n) or m > n or \
            value.dtype.kind != "f":
        return False
    keep = causal_keep(m, n)
    flat = value.reshape(-1, m, n)
    return bool(np.all(flat[:, keep] == 0.0) and np.all(flat[:, ~keep] <= _HIDDEN))


# -- the head split and merge as layouts ------------------------------------------------------

_HEAD_SWAP = (0, 2, 1, 3)


@register_step_pass
def fold_head_transposes(steps: list[Any], ctx: StepContext) -> list[Any]:
    """Attention kernels read Q, K and V and write Y in the projections' own token-major
    layout (``tokens`` of the attention kind) where the graph splits heads with ``Reshape``
    to ``[b, s, h, d]`` then ``Transpose(0, 2, 1, 3)`` and merges them back with the inverse:
    those Transposes (and batch-regrouping Reshapes between them and the kernel) are dropped
    instead of copying every head once per layer. A tensor also read elsewhere keeps its
    transpose (a key/value cache's ``present`` output, say)."""
    dropped: set[int] = set()
    out = list(steps)
    reads, writes = readers(steps), producers(steps)
    for position, step in enumerate(steps):
        op = getattr(step, "op", None)
        if op is None or op.kind != "attention" or op.attr("tokens") != "none":
            continue
        folded = _head_layout(step, steps, ctx, reads, writes, dropped)
        if folded is not None:
            out[position], absorbed = folded
            dropped.update(absorbed)
    return [step for position, step in enumerate(out) if position not in dropped]


def _head_layout(step: Any, steps: list[Any], ctx: StepContext, reads: dict[str, list[int]],
                 writes: dict[str, int], dropped: set[int]) -> tuple[Any, list[int]] | None:
    """The attention kernel node with its head transposes folded in, and the positions of
    the steps it absorbs; None when none folds."""
    op = step.op
    rows = {"q": op.dim("M"), "k": op.dim("N"), "v": op.dim("N"), "y": op.dim("M")}
    widths = {"q": op.dim("D"), "k": op.dim("D"), "v": value_dim(op), "y": value_dim(op)}
    found: dict[str, tuple[str, list[int]]] = {}
    heads = 0
    for tensor, name in (*zip("qkv", step.inputs[:3], strict=True), ("y", step.output)):
        chain = (_split_heads(name, steps, ctx, reads, writes) if tensor != "y"
                 else _merge_heads(name, steps, ctx, reads))
        if chain is None or any(p in dropped for p in chain[1]):
            continue
        shape = ctx.shape(chain[0]) or ()
        h = shape[2] if len(shape) == 4 else 0
        if len(shape) != 4 or shape[0] * h != op.dim("B") or shape[1] != rows[tensor] or \
                shape[3] != widths[tensor] or heads not in (0, h):
            continue
        heads = h
        found[tensor] = chain if tensor == "y" else _unsplit(chain, steps, ctx, reads, writes)
    if not found:
        return None
    tokens = "".join(t for t in "qkvy" if t in found)
    sig = attention_op(op.dim("B"), op.dim("M"), op.dim("N"), op.dim("D"), Dv=value_dim(op),
                       mask=op.attr("mask"), mask_rows=op.dim("mask_rows") or None,
                       scale=op.attr("scale"), tokens=tokens, heads=heads, dtype=op.dtype)
    inputs = [found[t][0] if t in found else name
              for t, name in zip("qkv", step.inputs[:3], strict=True)]
    output = found["y"][0] if "y" in found else step.output
    absorbed = sorted(p for _, chain in found.values() for p in chain)
    names = tuple(steps[p].name for p in absorbed)
    node = replace(step, op=sig, inputs=(*inputs, *step.inputs[3:]), output=output,
                   output_shape=ctx.shape(output) or step.output_shape,
                   nodes=(*step.nodes, *names))
    return node, absorbed


def _split_heads(name: str, steps: list[Any], ctx: StepContext, reads: dict[str, list[int]],
                 writes: dict[str, int]) -> tuple[str, list[int]] | None:
    """``(source, positions)`` when ``name`` is ``Transpose(0, 2, 1, 3)`` of ``source``
    (``[b, s, h, d]``), possibly regrouped by Reshapes, each link read only by the next."""
    chain: list[int] = []
    while True:
        position = writes.get(name)
        if position is None or len(reads.get(name, ())) != 1 or ctx.is_graph_output(name):
            return None
        node = steps[position]
        if _is_head_swap(node, ctx):
            return node.inputs[0], [*chain, position]
        if not _regroups_batch(node, ctx):
            return None
        chain.append(position)
        name = node.inputs[0]


def _unsplit(chain: tuple[str, list[int]], steps: list[Any], ctx: StepContext,
             reads: dict[str, list[int]], writes: dict[str, int]) -> tuple[str, list[int]]:
    """``chain`` reaching back past the Reshape that split the projection's ``[b, s, h*d]``
    into ``[b, s, h, d]`` where only the chain reads the split: the kernel then reads the
    projection's output itself (the same bytes), which a bf16 projection can hand it as
    bfloat16 (:mod:`tunecache.compiler.lowering.bf16`)."""
    source, positions = chain
    position = writes.get(source)
    if position is None:
        return chain
    node = steps[position]
    if getattr(node, "op_type", None) != "Reshape" or len(reads.get(source, ())) != 1 or \
            ctx.is_graph_output(source):
        return chain
    split, whole = ctx.shape(source) or (), ctx.shape(node.inputs[0]) or ()
    if len(split) != 4 or tuple(whole) != (split[0], split[1], split[2] * split[3]):
        return chain
    return node.inputs[0], [*positions, position]


def _merge_heads(name: str, steps: list[Any], ctx: StepContext, reads: dict[str, list[int]]
                 ) -> tuple[str, list[int]] | None:
    """``(merged, positions)`` when ``name`` is read only by ``Transpose(0, 2, 1, 3)``
    (``[b, h, s, d]`` to ``merged``), possibly through batch-regrouping Reshapes."""
    chain: list[int] = []
    while True:
        after = reads.get(name, ())
        if len(after) != 1 or ctx.is_graph_output(name):
            return None
        node = steps[after[0]]
        if getattr(node, "op_type", None) is None or node.inputs[0] != name:
            return None
        chain.append(after[0])
        if _is_head_swap(node, ctx):
            return node.outputs[0], chain
        if not _regroups_batch(node, ctx):
            return None
        name = node.outputs[0]


def _is_head_swap(node: Any, ctx: StepContext) -> bool:
    """A rank-4 ``Transpose(0, 2, 1, 3)`` run in numpy."""
    if getattr(node, "op_type", None) != "Transpose":
        return False
    shape = ctx.shape(node.inputs[0]) or ()
    return len(shape) == 4 and tuple(int(p) for p in node.attrs.get("perm", ())) == _HEAD_SWAP


def _regroups_batch(node: Any, ctx: StepContext) -> bool:
    """A Reshape run in numpy that only regroups the batch dims (the last two stay)."""
    if getattr(node, "op_type", None) != "Reshape":
        return False
    before, after = ctx.shape(node.inputs[0]), ctx.shape(node.outputs[0])
    return before is not None and after is not None and len(before) >= 2 and \
        len(after) >= 2 and before[-2:] == after[-2:]
