"""Node rewrites the loader applies before lowering: each turns a node the kernels do not
know into nodes they do (a ``ConvTranspose`` into a ``Conv`` and an interleave, an
``Einsum`` product into a ``MatMul``, a group normalisation into a layer normalisation
and a per-channel affine, DepthToSpace into a strided copy), so the lowerings see only what they know. One
module per rewrite; :func:`rewrite_nodes` runs them in order."""

from __future__ import annotations

from collections.abc import Callable

from tunecache.compiler.onnx_nodes import ReadNode
from tunecache.compiler.rewrites.conv_transpose import transposed_convs
from tunecache.compiler.rewrites.depth_space import depth_space_views
from tunecache.compiler.rewrites.einsum import einsum_products
from tunecache.compiler.rewrites.group_norm import group_norms
from tunecache.compiler.rewrites.tensors import RewriteTensors

__all__ = ["REWRITES", "RewriteTensors", "rewrite_nodes"]

Rewrite = Callable[[list[ReadNode], RewriteTensors], list[ReadNode]]

REWRITES: tuple[Rewrite, ...] = (einsum_products, transposed_convs, group_norms,
                                  depth_space_views)


def rewrite_nodes(nodes: list[ReadNode], tensors: RewriteTensors) -> list[ReadNode]:
    """``nodes`` after every rewrite in :data:`REWRITES`."""
    for rewrite in REWRITES:
        nodes = rewrite(nodes, tensors)
    return nodes
