"""``DepthToSpace`` and ``SpaceToDepth`` as the ``Reshape``/``Transpose``/``Reshape`` they
are: two views and one native strided copy, where the reference implementation ran them
(sub-pixel upsampling in super-resolution networks, YOLO's reorg).

``DepthToSpace`` with block ``b`` reads channel ``(i*b + j)*C' + c`` (``DCR``, the default)
or ``(c*b + i)*b + j`` (``CRD``, PixelShuffle's) into output ``(c, h*b + i, w*b + j)``;
``SpaceToDepth`` is the inverse of either (``mode`` from opset 24; DCR before).
:func:`depth_space_views` rewrites each float32 node whose input shape is known and
divisible by the block.
"""

from __future__ import annotations

import numpy as np

from tunecache.compiler.onnx_nodes import ReadNode
from tunecache.compiler.rewrites.tensors import NodeChain, RewriteTensors, rewrite_each

__all__ = ["depth_space_views"]


def depth_space_views(nodes: list[ReadNode], tensors: RewriteTensors) -> list[ReadNode]:
    """``nodes`` with each DepthToSpace/SpaceToDepth this module handles rewritten."""
    return rewrite_each(nodes, tensors, _shape, _rewrite)


def _shape(node: ReadNode, tensors: RewriteTensors) -> tuple[int | None, int, int, int] | None:
    if node.domain or node.op_type not in ("DepthToSpace", "SpaceToDepth"):
        return None
    shape = tensors.shapes.get(node.inputs[0])
    block = int(node.attrs.get("blocksize", 0))
    if shape is None or len(shape) != 4 or any(d is None for d in shape[1:]) or block < 1 or \
            tensors.dtypes.get(node.inputs[0]) != np.float32:
        return None
    n, c, h, w = shape[0], int(shape[1] or 0), int(shape[2] or 0), int(shape[3] or 0)
    if node.op_type == "DepthToSpace" and c % (block * block):
        return None
    if node.op_type == "SpaceToDepth" and (h % block or w % block):
        return None
    return n, c, h, w


def _rewrite(node: ReadNode, shape: tuple[int | None, int, int, int],
             tensors: RewriteTensors) -> list[ReadNode]:
    n, c, h, w = shape
    b = int(node.attrs["blocksize"])
    chain = NodeChain(node, tensors)
    crd = str(node.attrs.get("mode", "DCR")) == "CRD"
    if node.op_type == "SpaceToDepth":  # DCR's channel (i*b + j)*C + c, CRD's (c*b + i)*b + j
        split = chain.reshape(node.inputs[0], (n, c, h // b, b, w // b, b))
        moved = chain.add("Transpose", (split,), (n, c, b, b, h // b, w // b) if crd else
                          (n, b, b, c, h // b, w // b),
                          perm=(0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4))
        chain.reshape(moved, (n, c * b * b, h // b, w // b))
    elif crd:
        split = chain.reshape(node.inputs[0], (n, c // (b * b), b, b, h, w))
        moved = chain.add("Transpose", (split,), (n, c // (b * b), h, b, w, b),
                          perm=(0, 1, 4, 2, 5, 3))
        chain.reshape(moved, (n, c // (b * b), h * b, w * b))
    else:
        split = chain.reshape(node.inputs[0], (n, b, b, c // (b * b), h, w))
        moved = chain.add("Transpose", (split,), (n, c // (b * b), h, b, w, b),
                          perm=(0, 3, 4, 1, 5, 2))
        chain.reshape(moved, (n, c // (b * b), h * b, w * b))
    return chain.finish()
