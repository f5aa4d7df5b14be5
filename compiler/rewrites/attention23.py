"""Opset 23's ``Attention`` node as the MatMul/Softmax/MatMul it computes, which the
attention lowering turns into one attention kernel.

:func:`attention_nodes` rewrites an ``Attention`` with 4-D ``[B, H, S, D]`` inputs, or 3-D
``[B, S, H*D]`` ones with ``q_num_heads``/``kv_num_heads``, of known shapes: ``MatMul(Q,
Transpose(K))``, ``Mul`` by the scale (``1/sqrt(D)`` by default), an additive float mask or
the causal one (upper-left aligned, a constant), ``Softmax`` over the last axis and
``MatMul`` by V. Grouped-query K and V (fewer heads than Q) are repeated per group by
``Reshape``/``Expand``/``Reshape`` (native copies), as Llama's exports do. Left to the
reference implementation: a past key/value cache, ``present``/``qk_matmul_output`` outputs,
``softcap``, a boolean mask, and softmax precisions other than float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tunecache.compiler.onnx_nodes import ReadNode
from tunecache.compiler.rewrites.tensors import NodeChain, RewriteTensors, rewrite_each

__all__ = ["KNOWN_ATTRIBUTES", "attention_nodes"]

KNOWN_ATTRIBUTES = frozenset({"is_causal", "kv_num_heads", "q_num_heads", "scale", "softcap",
                              "softmax_precision", "qk_matmul_output_mode"})
"""Opset 23's attributes: a node with any other is left alone."""


@dataclass(frozen=True)
class _Heads:
    """Batch, heads and lengths of one attention node."""

    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head: int
    value_head: int
    flat: bool  # 3-D inputs [B, S, heads*D]


def attention_nodes(nodes: list[ReadNode], tensors: RewriteTensors) -> list[ReadNode]:
    """``nodes`` with each opset-23 Attention this module handles rewritten."""
    return rewrite_each(nodes, tensors, _heads, _rewrite)


def _heads(node: ReadNode, tensors: RewriteTensors) -> _Heads | None:
    if node.op_type != "Attention" or node.domain or len(node.inputs) < 3 or \
            any(node.inputs[4:]) or any(node.outputs[1:]):
        return None
    shapes = [tensors.shapes.get(t) for t in node.inputs[:3]]
    attrs = node.attrs
    if set(attrs) - KNOWN_ATTRIBUTES:
        return None  # a later opset's (a local window, say): the reference's
    if any(s is None or None in s or len(s) not in (3, 4) for s in shapes) or \
            float(attrs.get("softcap", 0.0)) != 0.0 or \
            int(attrs.get("softmax_precision", 1)) != 1 or \
            any(tensors.dtypes.get(t) != np.float32 for t in node.inputs[:3]):
        return None
    mask = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3] else None
    if mask is not None and tensors.dtypes.get(mask) != np.float32:
        return None  # a boolean mask: the reference's
    q, k, v = (tuple(int(d or 0) for d in s or ()) for s in shapes)
    if len(q) == 4:
        heads = _Heads(q[0], q[1], k[1], q[2], k[2], q[3], v[3], False)
    else:
        qh, kvh = int(attrs.get("q_num_heads", 0)), int(attrs.get("kv_num_heads", 0))
        if qh < 1 or kvh < 1 or q[2] % qh or k[2] % kvh or v[2] % kvh:
            return None
        heads = _Heads(q[0], qh, kvh, q[1], k[1], q[2] // qh, v[2] // kvh, True)
    if heads.q_heads % heads.kv_heads:
        return None
    return heads


def _rewrite(node: ReadNode, heads: _Heads, tensors: RewriteTensors) -> list[ReadNode]:
    chain = NodeChain(node, tensors)
    b, hq, hkv, sq, skv = heads.batch, heads.q_heads, heads.kv_heads, heads.q_len, heads.kv_len
    q = _split_heads(chain, node.inputs[0], heads, hq, sq, heads.head)
    k = _repeat(chain, _split_heads(chain, node.inputs[1], heads, hkv, skv, heads.head),
                heads, heads.head)
    v = _repeat(chain, _split_heads(chain, node.inputs[2], heads, hkv, skv, heads.value_head),
                heads, heads.value_head)
    kt = chain.add("Transpose", (k,), (b, hq, heads.head, skv), perm=(0, 1, 3, 2))
    scores = chain.add("MatMul", (q, kt), (b, hq, sq, skv))
    scale = float(node.attrs.get("scale", 1.0 / math.sqrt(heads.head)))
    scores = chain.add("Mul", (scores, chain.constant("scale", np.array(scale, np.float32))),
                       (b, hq, sq, skv))
    if len(node.inputs) > 3 and node.inputs[3]:
        scores = chain.add("Add", (scores, node.inputs[3]), (b, hq, sq, skv))
    if int(node.attrs.get("is_causal", 0)):
        causal = np.where(np.tril(np.ones((sq, skv), bool)), 0.0, -np.inf).astype(np.float32)
        scores = chain.add("Add", (scores, chain.constant("causal", causal)), (b, hq, sq, skv))
    weights = chain.add("Softmax", (scores,), (b, hq, sq, skv), axis=-1)
    y = chain.add("MatMul", (weights, v), (b, hq, sq, heads.value_head))
    if heads.flat:
        y = chain.add("Transpose", (y,), (b, sq, hq, heads.value_head), perm=(0, 2, 1, 3))
        chain.reshape_all(y, (b, sq, hq * heads.value_head))
    return chain.finish()


def _split_heads(chain: NodeChain, tensor: str, heads: _Heads, count: int, length: int,
                 size: int) -> str:
    """A 3-D ``[B, S, count*size]`` input as ``[B, count, S, size]``; 4-D as it is."""
    if not heads.flat:
        return tensor
    split = chain.reshape_all(tensor, (heads.batch, length, count, size))
    return chain.add("Transpose", (split,), (heads.batch, count, length, size),
                     perm=(0, 2, 1, 3))


def _repeat(chain: NodeChain, tensor: str, heads: _Heads, size: int) -> str:
    """K or V with each of its heads repeated for the query heads of its group."""
    group = heads.q_heads // heads.kv_heads
    if group == 1:
        return tensor
    b, hkv, s = heads.batch, heads.kv_heads, heads.kv_len
    lifted = chain.reshape_all(tensor, (b, hkv, 1, s, size))
    target = chain.constant("expand", np.array((b, hkv, group, s, size), np.int64))
    wide = chain.add("Expand", (lifted, target), (b, hkv, group, s, size))
    return chain.reshape_all(wide, (b, heads.q_heads, s, size))
