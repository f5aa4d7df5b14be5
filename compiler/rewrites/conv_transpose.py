"""``ConvTranspose`` as the ``Conv`` it is, followed by the interleave of its phases.

A transposed convolution with stride ``s`` writes output ``o = i*s + k*d - pad`` from input
``i`` and tap ``k``. Split the outputs by phase ``r = (o + pad) mod s``: each phase is an
ordinary stride-1 correlation of the input with the taps of that phase (the kernel flipped,
``ceil(K/s)`` taps). :func:`transposed_convs` rewrites a 1-D or 2-D ``ConvTranspose`` with
constant weights into one ``Conv`` computing every phase at once (``s_h*s_w`` times the
output channels, the bias repeated per phase), a ``Reshape``/``Transpose``/``Reshape`` that
interleaves the phases (two views and one native strided copy), and a ``Slice`` for the
pads and ``output_padding`` it crops (omitted where nothing is cropped; at stride 1 the
pads are the Conv's own). The lowerings then see a Conv, which becomes a tuned conv2d
kernel, where the reference implementation ran per-element Python (U-Net's and DCGAN's
upsampling, Mask R-CNN's mask head).

Left to the reference: ``output_shape``, ``auto_pad`` other than ``NOTSET``/``VALID``,
dilation together with stride on one axis, 3-D, weights or bias that are not constants,
and spatial sizes not known when the model loads.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunecache.compiler.onnx_nodes import ReadNode
from tunecache.compiler.rewrites.tensors import NodeChain, RewriteTensors, rewrite_each

__all__ = ["transposed_convs"]


@dataclass(frozen=True)
class _Axis:
    """One spatial axis of a transposed convolution and the correlation that computes it."""

    size: int       # input length
    kernel: int
    stride: int
    dilation: int
    begin: int      # the ConvTranspose's pads
    end: int
    extra: int      # output_padding

    @property
    def out(self) -> int:
        return (self.stride * (self.size - 1) + self.extra + (self.kernel - 1) * self.dilation
                + 1 - self.begin - self.end)

    @property
    def reach(self) -> int:
        """How many phase indices before its own an output reads the input from."""
        return (self.kernel - 1) * self.dilation // self.stride

    @property
    def taps(self) -> int:
        return self.kernel if self.stride == 1 else self.reach + 1

    @property
    def conv_dilation(self) -> int:
        return self.dilation if self.stride == 1 else 1

    @property
    def pads_are_conv(self) -> bool:
        """At stride 1 the ConvTranspose's pads, where they crop no more than the reach,
        are the Conv's: nothing left to crop."""
        return self.stride == 1 and self.begin <= self.reach and self.end <= self.reach + self.extra

    @property
    def conv_pads(self) -> tuple[int, int]:
        if self.pads_are_conv:
            return self.reach - self.begin, self.reach + self.extra - self.end
        indices = -(-(self.begin + self.out) // self.stride)
        return self.reach, max(0, indices - self.size)

    @property
    def conv_out(self) -> int:
        return self.size + sum(self.conv_pads) - self.reach

    @property
    def crop_start(self) -> int:
        return 0 if self.pads_are_conv else self.begin

    def tap(self, k: int) -> tuple[int, int]:
        """``(phase, correlation tap)`` of kernel tap ``k``."""
        shift = k * self.dilation
        return shift % self.stride, (self.reach - shift // self.stride) // self.conv_dilation


def transposed_convs(nodes: list[ReadNode], tensors: RewriteTensors) -> list[ReadNode]:
    """``nodes`` with each ConvTranspose this module handles replaced by Conv, interleave
    and crop nodes; new tensors and constants are added to ``tensors``."""
    return rewrite_each(nodes, tensors, _axes, _rewrite)


def _axes(node: ReadNode, tensors: RewriteTensors) -> list[_Axis] | None:
    if node.op_type != "ConvTranspose" or node.domain or len(node.inputs) < 2:
        return None
    x_shape, weight = tensors.shapes.get(node.inputs[0]), tensors.constants.get(node.inputs[1])
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    if x_shape is None or weight is None or weight.dtype != np.float32 or \
            tensors.dtypes.get(node.inputs[0]) != np.float32 or len(x_shape) not in (3, 4) or \
            any(d is None for d in x_shape[2:]) or weight.ndim != len(x_shape) or \
            (bias is not None and bias not in tensors.constants):
        return None
    attrs, rank = node.attrs, len(x_shape) - 2
    auto_pad = str(attrs.get("auto_pad", "NOTSET"))
    if "output_shape" in attrs or auto_pad not in ("NOTSET", "VALID"):
        return None

    def per_axis(name: str, default: int, count: int = rank) -> tuple[int, ...]:
        return tuple(int(v) for v in attrs.get(name) or (default,) * count)

    kernel, strides = per_axis("kernel_shape", 0), per_axis("strides", 1)
    dilations, extra = per_axis("dilations", 1), per_axis("output_padding", 0)
    pads = (0,) * 2 * rank if auto_pad == "VALID" else per_axis("pads", 0, 2 * rank)
    if kernel != (0,) * rank and kernel != tuple(weight.shape[2:]):
        return None
    if min(strides + dilations) < 1 or min(pads) < 0 or \
            weight.shape[0] % int(attrs.get("group", 1)):
        return None
    axes = [_Axis(int(x_shape[2 + i] or 0), int(weight.shape[2 + i]), strides[i], dilations[i],
                  pads[i], pads[rank + i], extra[i]) for i in range(rank)]
    if any(a.stride > 1 and a.dilation > 1 for a in axes) or min(a.out for a in axes) < 1:
        return None
    expected = tensors.shapes.get(node.outputs[0])
    if expected is not None and tuple(expected[2:]) != tuple(a.out for a in axes):
        return None  # shape inference and this module disagree: the reference decides
    return axes


def _rewrite(node: ReadNode, axes: list[_Axis], tensors: RewriteTensors) -> list[ReadNode]:
    weight = tensors.constants[node.inputs[1]]
    groups, per_group = int(node.attrs.get("group", 1)), int(weight.shape[1])
    phases = math.prod(a.stride for a in axes)
    n = tensors.shapes[node.inputs[0]][0]
    chain = NodeChain(node, tensors)
    inputs = [node.inputs[0], chain.constant("weight", _weight(weight, groups, axes))]
    if len(node.inputs) > 2 and node.inputs[2]:
        bias = tensors.constants[node.inputs[2]].reshape(groups, 1, per_group)
        inputs.append(chain.constant("bias", np.broadcast_to(
            bias, (groups, phases, per_group)).reshape(-1)))
    conv_shape = (n, groups * phases * per_group, *(a.conv_out for a in axes))
    y = chain.add("Conv", tuple(inputs), conv_shape,
                  kernel_shape=tuple(a.taps for a in axes),
                  pads=tuple(a.conv_pads[0] for a in axes) + tuple(a.conv_pads[1] for a in axes),
                  dilations=tuple(a.conv_dilation for a in axes), strides=(1,) * len(axes),
                  group=groups)
    if phases > 1:
        y = _interleave(chain, y, groups, per_group, axes)
    if any(a.crop_start or a.conv_out * a.stride != a.out for a in axes):
        chain.slice(y, [2 + i for i in range(len(axes))], [a.crop_start for a in axes],
                    [a.crop_start + a.out for a in axes],
                    (n, groups * per_group, *(a.out for a in axes)))
    return chain.finish()


def _weight(weight: np.ndarray, groups: int, axes: list[_Axis]) -> np.ndarray:
    """The Conv weight ``[groups, phases..., out per group, in per group, taps...]``
    flattened to ``[groups*phases*out per group, in per group, taps...]``."""
    cin, per_group = weight.shape[:2]
    by_group = weight.reshape(groups, cin // groups, per_group, *weight.shape[2:])
    conv = np.zeros((groups, *(a.stride for a in axes), per_group, cin // groups,
                     *(a.taps for a in axes)), np.float32)
    every = slice(None)
    for ks in itertools.product(*(range(a.kernel) for a in axes)):
        phase, tap = zip(*(a.tap(k) for a, k in zip(axes, ks, strict=True)), strict=True)
        target: tuple[Any, ...] = (every, *phase, every, every, *tap)
        source: tuple[Any, ...] = (every, every, every, *ks)
        conv[target] = by_group[source].transpose(0, 2, 1)
    return conv.reshape(-1, cin // groups, *(a.taps for a in axes))


def _interleave(chain: NodeChain, y: str, groups: int, per_group: int,
                axes: list[_Axis]) -> str:
    """``[N, groups*phases*C, Q...]`` as ``[N, groups*C, Q_0*s_0, ...]``, each output
    index ``q*s + r`` from phase ``r``."""
    rank, n = len(axes), chain.tensors.shapes[y][0]
    strides, sizes = [a.stride for a in axes], [a.conv_out for a in axes]
    split = chain.reshape(y, (n, groups, *strides, per_group, *sizes))
    perm = [0, 1, 2 + rank] + [d for i in range(rank) for d in (3 + rank + i, 2 + i)]
    moved = chain.add("Transpose", (split,), (n, groups, per_group, *(
        d for q, s in zip(sizes, strides, strict=True) for d in (q, s))), perm=tuple(perm))
    return chain.reshape(moved, (n, groups * per_group,
                                 *(q * s for q, s in zip(sizes, strides, strict=True))))
