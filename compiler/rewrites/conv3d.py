"""A 3-D ``Conv`` as one 2-D convolution over depth-gathered channels.

Output depth slice ``d`` of a 3-D convolution is the 2-D convolution of the ``kd`` input
depth slices it reads (``d*sd + t*dd - pad`` for tap ``t``), stacked as ``kd*C`` channels,
with the weights ``W[F, C, t, ...]`` stacked the same way. :func:`depth_gathered_convs`
rewrites each float32 3-D ``Conv`` (``group`` 1, constant weights, known shapes, explicit or
``VALID`` pads) into ``Transpose`` to ``[N, D, C, H, W]`` (one native copy), zero depth
slices ``Concat``-ed on for the depth pads, one strided ``Slice`` per depth tap, their
``Concat`` along channels as ``[N*Dout, kd*C, H, W]`` images, one ``Conv`` (a conv2d kernel,
bias fused) and the ``Transpose`` back to ``[N, F, Dout, P, Q]``. Video networks
(torchvision's R3D, MC3, R(2+1)D) ran their Conv3d in the reference implementation, element
by element.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tunecache.compiler.onnx_nodes import ReadNode
from tunecache.compiler.rewrites.tensors import NodeChain, RewriteTensors, rewrite_each

__all__ = ["depth_gathered_convs"]


@dataclass(frozen=True)
class _Depth:
    """The depth axis of a 3-D convolution and the rest of its attributes, as a 2-D Conv's."""

    n: int
    c: int
    d: int
    h: int
    w: int
    kd: int
    stride: int
    dilation: int
    begin: int
    end: int
    conv2d: dict[str, tuple[int, ...]]

    @property
    def out(self) -> int:
        return (self.d + self.begin + self.end - self.dilation * (self.kd - 1) - 1) \
            // self.stride + 1


def depth_gathered_convs(nodes: list[ReadNode], tensors: RewriteTensors) -> list[ReadNode]:
    """``nodes`` with each 3-D Conv this module handles rewritten as a 2-D one."""
    return rewrite_each(nodes, tensors, _depth, _rewrite)


def _depth(node: ReadNode, tensors: RewriteTensors) -> _Depth | None:
    if node.op_type != "Conv" or node.domain or len(node.inputs) < 2:
        return None
    x, weight = tensors.shapes.get(node.inputs[0]), tensors.constants.get(node.inputs[1])
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    attrs = node.attrs
    auto_pad = str(attrs.get("auto_pad", "NOTSET"))
    if x is None or len(x) != 5 or None in x or weight is None or weight.ndim != 5 or \
            weight.dtype != np.float32 or tensors.dtypes.get(node.inputs[0]) != np.float32 or \
            int(attrs.get("group", 1)) != 1 or auto_pad not in ("NOTSET", "VALID") or \
            (bias is not None and bias not in tensors.constants):
        return None
    strides = tuple(int(v) for v in attrs.get("strides") or (1, 1, 1))
    dilations = tuple(int(v) for v in attrs.get("dilations") or (1, 1, 1))
    pads = (0,) * 6 if auto_pad == "VALID" else \
        tuple(int(v) for v in attrs.get("pads") or (0,) * 6)
    n, c, d, h, w = (int(v or 0) for v in x)
    if weight.shape[1] != c or min(strides + dilations) < 1 or min(pads) < 0 or \
            (tensors.opset < 10 and strides[0] > 1):  # (no Slice steps before opset 10)
        return None
    depth = _Depth(n, c, d, h, w, int(weight.shape[2]), strides[0], dilations[0], pads[0],
                   pads[3], {"strides": strides[1:], "dilations": dilations[1:],
                             "pads": (pads[1], pads[2], pads[4], pads[5]),
                             "kernel_shape": tuple(weight.shape[3:])})
    return depth if depth.out >= 1 else None


def _rewrite(node: ReadNode, depth: _Depth, tensors: RewriteTensors) -> list[ReadNode]:
    chain = NodeChain(node, tensors)
    n, c, h, w, kd = depth.n, depth.c, depth.h, depth.w, depth.kd
    slices = chain.add("Transpose", (node.inputs[0],), (n, depth.d, c, h, w),
                       perm=(0, 2, 1, 3, 4))
    total = depth.d + depth.begin + depth.end
    if depth.begin or depth.end:
        parts = [chain.constant(f"zeros{k}", np.zeros((n, k, c, h, w), np.float32))
                 for k in (depth.begin, depth.end)]
        slices = chain.add("Concat", tuple(p for p, k in zip(
            (parts[0], slices, parts[1]), (depth.begin, 1, depth.end), strict=True) if k),
            (n, total, c, h, w), axis=1)
    span = depth.stride * (depth.out - 1) + 1
    taps = [slices if kd == 1 and span == total else chain.slice(
        slices, [1], [t * depth.dilation], [t * depth.dilation + span],
        (n, depth.out, c, h, w), steps=[depth.stride]) for t in range(kd)]
    gathered = taps[0] if kd == 1 else chain.add("Concat", tuple(taps),
                                                 (n, depth.out, kd * c, h, w), axis=2)
    images = chain.reshape_all(gathered, (n * depth.out, kd * c, h, w))
    weight = tensors.constants[node.inputs[1]]
    f = int(weight.shape[0])
    stacked = chain.constant("weight", weight.transpose(0, 2, 1, 3, 4).reshape(
        f, kd * c, *weight.shape[3:]))
    inputs = (images, stacked, *node.inputs[2:3])
    p, q = _plane(depth)
    conv = chain.add("Conv", inputs, (n * depth.out, f, p, q), **depth.conv2d)
    volumes = chain.reshape_all(conv, (n, depth.out, f, p, q))
    chain.add("Transpose", (volumes,), (n, f, depth.out, p, q), perm=(0, 2, 1, 3, 4))
    return chain.finish()


def _plane(depth: _Depth) -> tuple[int, int]:
    """The 2-D convolution's output height and width."""
    (sh, sw), (dh, dw) = depth.conv2d["strides"], depth.conv2d["dilations"]
    (kh, kw), (t, left, b, r) = depth.conv2d["kernel_shape"], depth.conv2d["pads"]
    return ((depth.h + t + b - dh * (kh - 1) - 1) // sh + 1,
            (depth.w + left + r - dw * (kw - 1) - 1) // sw + 1)
