"""``GroupNormalization`` and ``InstanceNormalization`` as a layer normalisation per group
and a per-channel scale and shift.

A group of channels of one image is contiguous in NCHW: ``x.reshape(N, G, -1)`` puts each
group in a row. :func:`group_norms` rewrites each node with a float32 input of known
channel and spatial sizes and constant scale and bias into ``Reshape`` (a view),
``LayerNormalization`` over the last axis without a scale (the ``layernorm`` kernel,
``affine=none``), ``Reshape`` back and ``Mul``/``Add`` by per-channel constants (an
``elementwise`` kernel, which also takes the activation after it). Instance normalisation
is the group normalisation with one channel per group. Where the reference (instance) or
numpy (group) ran them, style-transfer and diffusion networks now run kernels.
"""

from __future__ import annotations

import math

import numpy as np

from tunecache.compiler.onnx_nodes import ReadNode
from tunecache.compiler.rewrites.tensors import NodeChain, RewriteTensors, rewrite_each

__all__ = ["group_norms"]


def group_norms(nodes: list[ReadNode], tensors: RewriteTensors) -> list[ReadNode]:
    """``nodes`` with each group or instance normalisation this module handles rewritten."""
    return rewrite_each(nodes, tensors, _params, _rewrite)


def _params(node: ReadNode, tensors: RewriteTensors
            ) -> tuple[int, np.ndarray, np.ndarray] | None:
    """``(groups, per-channel scale, per-channel bias)`` of a node this module rewrites."""
    if node.domain or node.op_type not in ("GroupNormalization", "InstanceNormalization") \
            or len(node.inputs) != 3 or any(o for o in node.outputs[1:]):
        return None
    shape = tensors.shapes.get(node.inputs[0])
    scale, bias = (tensors.constants.get(t) for t in node.inputs[1:])
    if shape is None or len(shape) < 3 or any(d is None for d in shape[1:]) or \
            tensors.dtypes.get(node.inputs[0]) != np.float32 or scale is None or bias is None:
        return None
    channels = int(shape[1] or 0)
    groups = channels if node.op_type == "InstanceNormalization" else \
        int(node.attrs.get("num_groups", 0))
    if groups < 1 or channels % groups:
        return None
    if scale.size != channels or bias.size != channels:
        return None  # (opset 18's per-group GroupNormalization: onnx deprecated it)
    return groups, scale.astype(np.float32), bias.astype(np.float32)


def _rewrite(node: ReadNode, params: tuple[int, np.ndarray, np.ndarray],
             tensors: RewriteTensors) -> list[ReadNode]:
    groups, scale, bias = params
    shape = tensors.shapes[node.inputs[0]]
    n, channels = shape[0], int(shape[1] or 0)
    per_row = math.prod(int(d or 0) for d in shape[1:]) // groups
    chain = NodeChain(node, tensors)
    rows = chain.reshape(node.inputs[0], (n, groups, per_row))
    unit = chain.constant("unit_scale", np.ones(1, np.float32))
    normal = chain.add("LayerNormalization", (rows, unit), (n, groups, per_row), axis=-1,
                       epsilon=float(node.attrs.get("epsilon", 1e-5)))
    back = chain.reshape(normal, shape)
    per_channel = (channels,) + (1,) * (len(shape) - 2)
    scaled = chain.add("Mul", (back, chain.constant("scale", scale.reshape(per_channel))),
                       shape)
    chain.add("Add", (scaled, chain.constant("bias", bias.reshape(per_channel))), shape)
    return chain.finish()
