"""Node rewrites the loader applies before lowering: each turns a node the kernels do not
know into nodes they do (a ``ConvTranspose`` into a ``Conv`` and an interleave, an
``Einsum`` product into a ``MatMul``, a group normalisation into a layer normalisation and
a per-channel affine, DepthToSpace into a strided copy, an LSTM/GRU/RNN unrolled into
matmuls and gates, a 3-D Conv into a 2-D one over depth-gathered channels, opset 23's
Attention into MatMul/Softmax/MatMul), so the
lowerings see only what they know. One module per rewrite; :func:`rewrite_nodes` runs them
in order."""

from __future__ import annotations

from collections.abc import Callable

from tunecache.compiler.onnx_nodes import ReadNode
from tunecache.compiler.rewrites.attention23 import attention_nodes
from tunecache.compiler.rewrites.conv3d import depth_gathered_convs
from tunecache.compiler.rewrites.conv_transpose import transposed_convs
from tunecache.compiler.rewrites.depth_space import depth_space_views
from tunecache.compiler.rewrites.einsum import einsum_products
from tunecache.compiler.rewrites.group_norm import group_norms
from tunecache.compiler.rewrites.recurrent import recurrent_layers, reference_problem
from tunecache.compiler.rewrites.tensors import RewriteTensors

__all__ = ["REWRITES", "RewriteTensors", "leftover_problem", "rewrite_nodes"]

Rewrite = Callable[[list[ReadNode], RewriteTensors], list[ReadNode]]

REWRITES: tuple[Rewrite, ...] = (einsum_products, transposed_convs, depth_gathered_convs,
                                  group_norms, depth_space_views, recurrent_layers,
                                  attention_nodes)


def rewrite_nodes(nodes: list[ReadNode], tensors: RewriteTensors) -> list[ReadNode]:
    """``nodes`` after every rewrite in :data:`REWRITES`."""
    for rewrite in REWRITES:
        nodes = rewrite(nodes, tensors)
    return nodes


LEFTOVER_CHECKS: tuple[Callable[[ReadNode, RewriteTensors], str | None], ...] = (
    reference_problem,)
"""For node forms a rewrite handles that the reference implementation would get wrong:
why, for such a node the rewrite left."""


def leftover_problem(nodes: list[ReadNode], tensors: RewriteTensors) -> str | None:
    """``node 'n' (Op): why`` for the first node left after the rewrites that nothing would
    run correctly, or None."""
    for node in nodes:
        for check in LEFTOVER_CHECKS:
            problem = check(node, tensors)
            if problem:
                return f"node {node.name!r} ({node.op_type}): {problem}"
    return None
