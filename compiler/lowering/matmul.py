"""``MatMul`` and ``Gemm`` onto the ``matmul`` and ``batch_matmul`` kinds.

A product whose B is a constant is a ``matmul`` (B packed once at compile time); a product
of two activations, or one with batch dimensions, is a ``batch_matmul``. Followers fused in,
each the only reader of the running result (not a graph output): an ``Add`` of a bias over
the last axis (the ``bias`` epilogue; constants are folded together) and a ``Relu``, which
ends the chain. ``Gemm``'s ``alpha`` is folded into a constant operand and ``beta * C`` into
the bias.

Registered with ``explains``: why a MatMul or Gemm runs in numpy (broadcast batch
dimensions, an ``alpha`` with neither operand constant, ...) is its numpy node's note.
"""

from __future__ import annotations

import math
from typing import Any

from tunecache.compiler.graph import ModelError
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.lowering import (
    FusionContext,
    GraphNode,
    channel_constant,
    float32_kernel,
    register_lowering,
)


@register_lowering("MatMul", "Gemm", explains=True)
def lower_matmul(ctx: FusionContext, position: int) -> Any:
    """The matmul kernel for the MatMul or Gemm at ``position`` and its fused followers, or
    why not."""
    return float32_kernel(ctx, position, _matmul)


def _matmul(ctx: FusionContext, position: int) -> Any:
    node = ctx.nodes[position]
    a, b = node.inputs[0], node.inputs[1]
    a_shape, b_shape = ctx.shape(a), ctx.shape(b)
    if a_shape is None or b_shape is None:
        # a shape that depends on the data (after a TopK, NonZero or an If): numpy's
        return "an operand whose shape depends on the data"
    if not a_shape or not b_shape:
        return "a scalar operand (MatMul needs at least 1-D operands)"
    bias: str | None = None
    trans_a = trans_b = False
    if node.op_type == "Gemm":
        built = _gemm_operands(ctx, node, a_shape, b_shape)
        if isinstance(built, str):
            return built
        a, b, bias, trans_a, trans_b = built
        m = a_shape[1] if trans_a else a_shape[0]
        k = a_shape[0] if trans_a else a_shape[1]
        nn = b_shape[0] if trans_b else b_shape[1]
        batch, shared = 1, "plain"
    else:
        dims = _matmul_dims(node, a_shape, b_shape)
        if isinstance(dims, str):
            return dims
        m, nn, k, batch, shared = dims
    # With a 1-D B the output has no N axis, so a following Add is not a bias over N.
    fused, out, bias, relu = matmul_followers(ctx, position, nn, bias, len(b_shape) != 1)
    epilogue = tuple(e for e, on in (("bias", bias is not None), ("relu", relu)) if on)
    if shared == "plain" and b in ctx.constants:
        sig = matmul_op(m, nn, k, trans_a=trans_a, trans_b=trans_b, epilogue=epilogue)
    elif shared == "plain":
        # A product of two activations: batch_matmul, whose B is packed per call (the
        # matmul kind's B is a constant, packed once at compile time and timed so).
        sig = batch_matmul_op(1, m, nn, k, trans_a=trans_a, trans_b=trans_b,
                                       shared="none", epilogue=epilogue)
    else:
        sig = batch_matmul_op(batch, m, nn, k, shared=shared, epilogue=epilogue)
    return ctx.finish(position, fused, sig, [a, b] + ([bias] if bias else []), out)


def _matmul_dims(node: GraphNode, a_shape: tuple[int, ...], b_shape: tuple[int, ...]
                 ) -> tuple[int, int, int, int, str] | str:
    """``(M, N, K, batch, shared)`` of a MatMul (``shared``: ``plain`` for one matmul over
    flattened rows, ``a`` when A is shared by every batch, ``none`` for equal batch
    dimensions), or why no kernel computes it."""
    a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    m, k, nn = a2[-2], a2[-1], b2[-1]
    if b2[-2] != k:
        raise ModelError(f"node {node.name!r} (MatMul) multiplies {list(a_shape)} by "
                         f"{list(b_shape)}: inner dimensions differ")
    a_batch, b_batch = a2[:-2], b2[:-2]
    rank = max(len(a_batch), len(b_batch))
    a_pad = (1,) * (rank - len(a_batch)) + a_batch
    b_pad = (1,) * (rank - len(b_batch)) + b_batch
    if math.prod(b_batch) == 1:
        # [b..., M, K] . [K, N] is one matmul over the flattened rows.
        return m * math.prod(a_batch), nn, k, 1, "plain"
    if math.prod(a_batch) == 1:
        return m, nn, k, math.prod(b_batch), "a"
    if a_pad == b_pad:
        return m, nn, k, math.prod(a_batch), "none"
    return (f"broadcast batch dimensions {list(a_batch)} x {list(b_batch)} "
            "(kernels need equal batch dimensions or one 2-D operand)")


def matmul_followers(ctx: FusionContext, position: int, n: int, bias: str | None, bias_ok: bool
               ) -> tuple[list[int], str, str | None, bool]:
    """The positions fused after the product at ``position`` (itself first), the tensor the
    kernel writes, its bias and whether a ReLU ends it: bias ``Add`` s (when ``bias_ok``),
    then at most one ``Relu``."""
    node = ctx.nodes[position]
    fused = [position]
    out = node.outputs[0]
    relu = False
    while True:
        nxt = ctx.sole_consumer(out)
        if nxt is None:
            break
        follower = ctx.nodes[nxt]
        if follower.op_type == "Add" and not relu and bias_ok:
            other = follower.inputs[1] if follower.inputs[0] == out else follower.inputs[0]
            merged = _matmul_bias(ctx, other, out, follower.outputs[0], n, bias,
                                  f"{node.name}/bias")
            if merged is None:
                break
            bias = merged
        elif follower.op_type == "Relu":
            relu = True
        else:
            break
        fused.append(nxt)
        out = follower.outputs[0]
        if relu:
            break
    return fused, out, bias, relu


def _matmul_bias(ctx: FusionContext, other: str, product: str, result: str, n: int,
                 bias: str | None, base: str) -> str | None:
    """The bias tensor after adding ``other`` to a matmul's output, or None if not a bias."""
    out_shape = ctx.shape(result)
    if out_shape is None or out_shape != ctx.shape(product) or not ctx.is_float32(other):
        return None
    vector = channel_constant(ctx, other, out_shape, len(out_shape) - 1)
    if vector is not None:
        if bias is None:
            return other if ctx.shape(other) == (n,) else ctx.add_constant(base, vector)
        if bias in ctx.constants:
            return ctx.add_constant(base, ctx.constants[bias] + vector)
        return None
    shape = ctx.shape(other)
    if bias is None and shape is not None and len(shape) <= len(out_shape) and shape and (
            shape[-1] == n and math.prod(shape) == n):
        return other  # a computed bias vector, passed to the kernel as is
    return None


def _gemm_operands(ctx: FusionContext, node: GraphNode, a_shape: tuple[int, ...],
                   b_shape: tuple[int, ...]) -> tuple[str, str, str | None, bool, bool] | str:
    """(A, B, bias, transA, transB) for a Gemm, pre-scaling constants for alpha/beta."""
    a, b = node.inputs[0], node.inputs[1]
    c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    trans_a, trans_b = bool(node.attrs.get("transA", 0)), bool(node.attrs.get("transB", 0))
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    if len(a_shape) != 2 or len(b_shape) != 2:
        return "Gemm operands are not 2-D"
    n = b_shape[0] if trans_b else b_shape[1]
    m = a_shape[1] if trans_a else a_shape[0]
    if alpha != 1.0:
        if b in ctx.constants:
            b = ctx.add_constant(f"{node.name}/B_scaled", ctx.constants[b] * alpha)
        elif a in ctx.constants:
            a = ctx.add_constant(f"{node.name}/A_scaled", ctx.constants[a] * alpha)
        else:
            return f"alpha={alpha:g} with neither operand constant"
    bias: str | None = None
    if c is not None and beta != 0.0:
        vector = channel_constant(ctx, c, (m, n), 1)
        if vector is not None and beta == 1.0 and ctx.shape(c) == (n,):
            bias = c  # already the kernel's bias vector
        elif vector is not None:
            bias = ctx.add_constant(f"{node.name}/bias",
                                    vector * beta if beta != 1.0 else vector)
        elif beta == 1.0 and ctx.shape(c) in ((n,), (1, n)):
            bias = c
        else:
            return (f"C of shape {list(ctx.shape(c) or ())} (beta={beta:g}) is not a bias "
                    f"over N={n}")
    return a, b, bias, trans_a, trans_b
