"""Eleven image-classification CNNs of different families, built layer by layer with onnx.helper.

Each builder takes the square input size and returns an opset-13 (MobileNet-v3: 14) ``ModelProto`` with input
``image`` ``[1, 3, size, size]`` and output logits ``[1, 1000]``: the channel counts,
kernel sizes and strides of the published network, BatchNormalization where the network has
it, random weights from a fixed seed. Weights are He-scaled and BatchNorm is close to the
identity so activations stay of order one through every depth; residual branches end in a
BatchNorm of gain ``1/sqrt(2)`` so that sums do not double the variance at every block.

========================  ==========================================================  =========
key                       network (reference layout)                                  min size
========================  ==========================================================  =========
resnet50                  ResNet-50 v1.5 (torchvision; tests/onnx_support.py)          32
mobilenet_v2              MobileNet-v2 1.0 with ReLU6 as Clip(0, 6) (torchvision)        32
densenet121               DenseNet-121, growth 32 (torchvision)                         32
googlenet                 GoogLeNet / Inception v1 with BatchNorm, 5x5 branch (paper)   32
squeezenet1_1             SqueezeNet 1.1 (torchvision)                                  32
shufflenet_v2             ShuffleNet v2 x1.0 (torchvision)                              32
vgg16                     VGG-16, no BatchNorm (torchvision ``vgg16``)                  32
alexnet_lrn               AlexNet with LRN and grouped convs (BVLC Caffe, 224 input)    64
efficientnet_b0           EfficientNet-B0, SiLU and squeeze-excitation (torchvision)    32
mobilenet_v3_large        MobileNet-v3 Large, HardSwish and HardSigmoid (torchvision)   32
mobilenet_v3_small        MobileNet-v3 Small (torchvision)                              32
========================  ==========================================================  =========

The fully connected layers after the last pooling of VGG-16 and AlexNet take that pooling's
actual size (``512 * (size / 32)^2`` inputs for VGG-16), so smaller inputs keep the same
layers; at 224 every model has the published parameter count (:data:`PUBLISHED_PARAMS`).

    python benchmarks/cnn_zoo.py            # parameter counts, and a check in onnxruntime
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from onnx_support import Builder, resnet50_model

OPSET = 13
BN_EPS = 1e-5
RESIDUAL_GAIN = 1 / math.sqrt(2)
"""Gain of the BatchNorm ending a residual branch: identity + branch keeps unit variance."""

PUBLISHED_PARAMS: dict[str, int] = {
    "resnet50": 25_557_032,
    "mobilenet_v2": 3_504_872,
    "densenet121": 7_978_856,
    # torchvision's count: its "5x5" branches have 3x3 kernels; the paper's 5x5 kernels
    # built here add 16 * (reduce x output) weights per module, 380,928 in all.
    "googlenet": 6_624_904,
    "squeezenet1_1": 1_235_496,
    "shufflenet_v2": 2_278_604,
    "vgg16": 138_357_544,
    "alexnet_lrn": 60_965_224,
    "efficientnet_b0": 5_288_548,
    "mobilenet_v3_large": 5_483_032,
    "mobilenet_v3_small": 2_542_856,
}
"""Trainable parameters of the reference implementation (BatchNorm running statistics
excluded), for :func:`param_count` to be compared with."""

MIN_SIZE: dict[str, int] = {"alexnet_lrn": 64}
"""Smallest input size a model's pooling chain allows where it is above 32."""

_PARAM_PREFIXES = frozenset({"w", "b", "gamma", "beta"})


class CnnBuilder(Builder):
    """:class:`Builder` with He-scaled convolutions and near-identity BatchNorm."""

    def __init__(self, seed: int, opset: int = OPSET) -> None:
        super().__init__(opset, seed)

    def he_conv(self, x: str, c_in: int, c_out: int, k: int, *, stride: int = 1,
                pad: int | None = None, groups: int = 1, bias: bool = False,
                gain: float = math.sqrt(2.0)) -> str:
        """Conv with ``k x k`` kernel, symmetric ``pad`` (default ``k // 2``), weights of
        standard deviation ``gain / sqrt(fan_in)``."""
        fan_in = (c_in // groups) * k * k
        w = self.weight(c_out, c_in // groups, k, k, scale=gain / math.sqrt(fan_in))
        inputs = [x, w]
        if bias:
            inputs.append(self.bias(c_out))
        p = k // 2 if pad is None else pad
        return self.node("Conv", inputs, kernel_shape=[k, k], strides=[stride, stride],
                         pads=[p] * 4, group=groups)

    def bias(self, n: int) -> str:
        return self.const((0.01 * self.rng.standard_normal(n)).astype(np.float32), "b")

    def norm(self, x: str, channels: int, gain: float = 1.0, eps: float = BN_EPS) -> str:
        """Inference BatchNorm whose scale ``gamma / sqrt(var)`` is about ``gain``."""
        r = self.rng
        gamma = (gain * (1 + 0.1 * r.standard_normal(channels))).astype(np.float32)
        beta = (0.05 * r.standard_normal(channels)).astype(np.float32)
        mean = (0.05 * r.standard_normal(channels)).astype(np.float32)
        var = (0.8 + 0.4 * r.random(channels)).astype(np.float32)
        names = [self.const(a, p) for a, p in ((gamma, "gamma"), (beta, "beta"),
                                               (mean, "mean"), (var, "var"))]
        return self.node("BatchNormalization", [x, *names], epsilon=eps)

    def conv_bn(self, x: str, c_in: int, c_out: int, k: int, *, stride: int = 1,
                pad: int | None = None, groups: int = 1, act: str | None = "Relu",
                gain: float = 1.0, eps: float = BN_EPS, rectified: bool = True) -> str:
        """Conv (no bias) + BatchNorm of ``gain`` + activation: ``Relu``, ``Relu6``, ``SiLU``
        or None. ``rectified`` tells whether ``x`` comes from a rectifier (He gain sqrt 2)."""
        he = math.sqrt(2.0) if rectified else 1.0
        y = self.norm(self.he_conv(x, c_in, c_out, k, stride=stride, pad=pad, groups=groups,
                                   gain=he), c_out, gain, eps)
        return self.act(y, act)

    def act(self, x: str, kind: str | None) -> str:
        if kind is None:
            return x
        if kind == "Relu":
            return self.node("Relu", [x])
        if kind == "Relu6":
            return self.clip(x, 0.0, 6.0)
        if kind == "SiLU":
            return self.node("Mul", [x, self.node("Sigmoid", [x])])
        if kind == "HardSwish":  # opset 14 on
            return self.node("HardSwish", [x])
        if kind == "HardSigmoid":  # torch's: slope 1/6
            return self.node("HardSigmoid", [x], alpha=1 / 6, beta=0.5)
        raise ValueError(f"unknown activation {kind!r}")

    def pool(self, op: str, x: str, k: int, stride: int, pad: int = 0, ceil: bool = False) -> str:
        return self.node(op, [x], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                         ceil_mode=int(ceil))

    def fc(self, x: str, n_in: int, n_out: int) -> str:
        """Gemm (transB) with bias; weights scaled for unit output variance."""
        w = self.weight(n_out, n_in, scale=1 / math.sqrt(n_in), prefix="w")
        return self.node("Gemm", [x, w, self.bias(n_out)], transB=1)

    def head(self, x: str, channels: int, pooled: bool = False) -> str:
        """Global average pool (unless ``pooled``), Flatten, the 1000-way classifier."""
        if not pooled:
            x = self.node("GlobalAveragePool", [x])
        return self.fc(self.node("Flatten", [x], axis=1), channels, 1000)


def pooled_size(size: int, k: int, stride: int, pad: int = 0, ceil: bool = False) -> int:
    """Output size of a convolution or pooling window along one axis (ONNX rules)."""
    span = size + 2 * pad - k
    out = (-(-span // stride) if ceil else span // stride) + 1
    if ceil and (out - 1) * stride >= size + pad:
        out -= 1
    return out


# -- the networks --------------------------------------------------------------------------


def resnet50(size: int) -> onnx.ModelProto:
    """ResNet-50 v1.5: bottleneck residual blocks (3, 4, 6, 3), stride on the 3x3 conv."""
    return resnet50_model(1, size)


def mobilenet_v2(size: int) -> onnx.ModelProto:
    """MobileNet-v2 width 1.0: inverted residual blocks, ReLU6 exported as Clip(0, 6)."""
    b = CnnBuilder(seed=11)
    y = b.conv_bn(b.input("image", [1, 3, size, size]), 3, 32, 3, stride=2, act="Relu6")
    c_in = 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = c_in * t
            residual = stride == 1 and c_in == c
            h = y if t == 1 else b.conv_bn(y, c_in, hidden, 1, act="Relu6")
            h = b.conv_bn(h, hidden, hidden, 3, stride=stride, groups=hidden, act="Relu6")
            h = b.conv_bn(h, hidden, c, 1, act=None, gain=RESIDUAL_GAIN if residual else 1.0)
            y = b.node("Add", [y, h]) if residual else h
            c_in = c
    y = b.conv_bn(y, c_in, 1280, 1, act="Relu6")
    return b.model([b.head(y, 1280)], "mobilenet_v2")


def densenet121(size: int) -> onnx.ModelProto:
    """DenseNet-121: dense blocks (6, 12, 24, 16) of pre-activation BN-ReLU-1x1-BN-ReLU-3x3
    layers, each concatenating every earlier feature map of its block (growth 32)."""
    growth, bottleneck = 32, 4 * 32
    b = CnnBuilder(seed=12)
    y = b.conv_bn(b.input("image", [1, 3, size, size]), 3, 64, 7, stride=2)
    y = b.pool("MaxPool", y, 3, 2, pad=1)
    channels = 64
    for index, layers in enumerate((6, 12, 24, 16)):
        features = [y]
        for _ in range(layers):
            x = features[0] if len(features) == 1 else b.node("Concat", features, axis=1)
            t = b.node("Relu", [b.norm(x, channels)])
            t = b.conv_bn(t, channels, bottleneck, 1)
            features.append(b.he_conv(t, bottleneck, growth, 3))
            channels += growth
        y = b.node("Concat", features, axis=1)
        if index < 3:
            t = b.node("Relu", [b.norm(y, channels)])
            y = b.pool("AveragePool", b.he_conv(t, channels, channels // 2, 1, gain=1.0), 2, 2)
            channels //= 2
    y = b.node("Relu", [b.norm(y, channels)])
    return b.model([b.head(y, channels)], "densenet121")


_INCEPTIONS: tuple[tuple[str, int, int, int, int, int, int], ...] = (
    # name, 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection
    ("3a", 64, 96, 128, 16, 32, 32), ("3b", 128, 128, 192, 32, 96, 64),
    ("4a", 192, 96, 208, 16, 48, 64), ("4b", 160, 112, 224, 24, 64, 64),
    ("4c", 128, 128, 256, 24, 64, 64), ("4d", 112, 144, 288, 32, 64, 64),
    ("4e", 256, 160, 320, 32, 128, 128), ("5a", 256, 160, 320, 32, 128, 128),
    ("5b", 384, 192, 384, 48, 128, 128),
)


def googlenet(size: int) -> onnx.ModelProto:
    """GoogLeNet (Inception v1): nine inception modules of four concatenated branches (1x1;
    1x1-3x3; 1x1-5x5 as in the paper; 3x3 max pool-1x1), conv-BN-ReLU units (eps 1e-3),
    ceil-mode max pools between stages."""
    b = CnnBuilder(seed=13)
    y = b.conv_bn(b.input("image", [1, 3, size, size]), 3, 64, 7, stride=2, eps=1e-3)
    y = b.pool("MaxPool", y, 3, 2, ceil=True)
    y = b.conv_bn(y, 64, 64, 1, eps=1e-3)
    y = b.conv_bn(y, 64, 192, 3, eps=1e-3)
    y = b.pool("MaxPool", y, 3, 2, ceil=True)
    channels = 192
    for name, c1, r3, c3, r5, c5, cp in _INCEPTIONS:
        if name in ("4a", "5a"):
            k = 3 if name == "4a" else 2
            y = b.pool("MaxPool", y, k, 2, ceil=True)
        branches = [
            b.conv_bn(y, channels, c1, 1, eps=1e-3),
            b.conv_bn(b.conv_bn(y, channels, r3, 1, eps=1e-3), r3, c3, 3, eps=1e-3),
            b.conv_bn(b.conv_bn(y, channels, r5, 1, eps=1e-3), r5, c5, 5, eps=1e-3),
            b.conv_bn(b.pool("MaxPool", y, 3, 1, pad=1, ceil=True), channels, cp, 1, eps=1e-3),
        ]
        y = b.node("Concat", branches, axis=1)
        channels = c1 + c3 + c5 + cp
    return b.model([b.head(y, channels)], "googlenet")


def squeezenet1_1(size: int) -> onnx.ModelProto:
    """SqueezeNet 1.1: fire modules (1x1 squeeze, concatenated 1x1 and 3x3 expands), biased
    convs without BatchNorm, ceil-mode pools, a 1x1-conv classifier averaged over space."""
    b = CnnBuilder(seed=14)
    y = b.node("Relu", [b.he_conv(b.input("image", [1, 3, size, size]), 3, 64, 3, stride=2,
                                  pad=0, bias=True)])
    channels = 64
    for squeeze, expand, pool_before in ((16, 64, True), (16, 64, False), (32, 128, True),
                                         (32, 128, False), (48, 192, True), (48, 192, False),
                                         (64, 256, False), (64, 256, False)):
        if pool_before:
            y = b.pool("MaxPool", y, 3, 2, ceil=True)
        s = b.node("Relu", [b.he_conv(y, channels, squeeze, 1, bias=True)])
        e1 = b.node("Relu", [b.he_conv(s, squeeze, expand, 1, bias=True)])
        e3 = b.node("Relu", [b.he_conv(s, squeeze, expand, 3, bias=True)])
        y = b.node("Concat", [e1, e3], axis=1)
        channels = 2 * expand
    y = b.node("Relu", [b.he_conv(y, channels, 1000, 1, bias=True)])
    return b.model([b.node("Flatten", [b.node("GlobalAveragePool", [y])], axis=1)],
                   "squeezenet1_1")


def _channel_shuffle(b: CnnBuilder, x: str, channels: int, spatial: int) -> str:
    """Reshape [1, 2, C/2, H, W], swap the group axes, reshape back: the exported shuffle."""
    y = b.node("Reshape", [x, b.ints([1, 2, channels // 2, spatial, spatial])])
    y = b.node("Transpose", [y], perm=[0, 2, 1, 3, 4])
    return b.node("Reshape", [y, b.ints([1, channels, spatial, spatial])])


def _halves(b: CnnBuilder, x: str, channels: int, use_slice: bool) -> tuple[str, str]:
    """The two channel halves of ``x``, by Split or by two Slices (exporters emit both)."""
    half = channels // 2
    if not use_slice:
        first, second = b.node("Split", [x, b.ints([half, half])], n_out=2, axis=1)
        return first, second
    starts = [b.ints([0]), b.ints([half])]
    ends = [b.ints([half]), b.ints([channels])]
    axes = b.ints([1])
    return (b.node("Slice", [x, starts[0], ends[0], axes]),
            b.node("Slice", [x, starts[1], ends[1], axes]))


def shufflenet_v2(size: int) -> onnx.ModelProto:
    """ShuffleNet v2 x1.0: stages of (4, 8, 4) units, 116/232/464 channels. A stride-1 unit
    splits the channels in half (Split in stages 2 and 4, Slice in stage 3), transforms one
    half (1x1, 3x3 depthwise, 1x1), concatenates and shuffles the two groups."""
    b = CnnBuilder(seed=15)
    y = b.conv_bn(b.input("image", [1, 3, size, size]), 3, 24, 3, stride=2)
    y = b.pool("MaxPool", y, 3, 2, pad=1)
    spatial = pooled_size(pooled_size(size, 3, 2, 1), 3, 2, 1)
    channels = 24
    for stage, (repeats, out) in enumerate(((4, 116), (8, 232), (4, 464)), start=2):
        half = out // 2
        for i in range(repeats):
            if i == 0:
                spatial = pooled_size(spatial, 3, 2, 1)
                left = b.conv_bn(y, channels, channels, 3, stride=2, groups=channels, act=None)
                left = b.conv_bn(left, channels, half, 1, rectified=False)
                right = b.conv_bn(y, channels, half, 1)
                right = b.conv_bn(right, half, half, 3, stride=2, groups=half, act=None)
            else:
                left, right = _halves(b, y, out, use_slice=stage == 3)
                right = b.conv_bn(right, half, half, 1)
                right = b.conv_bn(right, half, half, 3, groups=half, act=None)
            right = b.conv_bn(right, half, half, 1, rectified=False)
            y = _channel_shuffle(b, b.node("Concat", [left, right], axis=1), out, spatial)
            channels = out
    y = b.conv_bn(y, channels, 1024, 1)
    y = b.node("ReduceMean", [y], axes=[2, 3], keepdims=0)
    return b.model([b.fc(y, 1024, 1000)], "shufflenet_v2")


def _classifier(b: CnnBuilder, x: str, n_in: int) -> str:
    """Two 4096-wide ReLU layers (dropout is the identity at inference) and the logits."""
    y = b.node("Flatten", [x], axis=1)
    y = b.node("Relu", [b.fc(y, n_in, 4096)])
    y = b.node("Relu", [b.fc(y, 4096, 4096)])
    return b.fc(y, 4096, 1000)


def vgg16(size: int) -> onnx.ModelProto:
    """VGG-16 (configuration D): thirteen 3x3 convs with bias and ReLU in five stages,
    2x2 max pools, the 4096-4096-1000 classifier."""
    b = CnnBuilder(seed=16)
    y = b.input("image", [1, 3, size, size])
    channels, spatial = 3, size
    for width, convs in ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)):
        for _ in range(convs):
            y = b.node("Relu", [b.he_conv(y, channels, width, 3, bias=True)])
            channels = width
        y = b.pool("MaxPool", y, 2, 2)
        spatial = pooled_size(spatial, 2, 2)
    return b.model([_classifier(b, y, channels * spatial * spatial)], "vgg16")


def alexnet_lrn(size: int) -> onnx.ModelProto:
    """AlexNet as trained in Caffe (BVLC): 11x11/4 conv, LRN (size 5, alpha 1e-4, beta 0.75)
    after the first two ReLUs, two-group convs 2, 4 and 5, 3x3/2 max pools, the
    4096-4096-1000 classifier; conv1 pads by 2 so a 224 input gives 55x55 (as exported)."""
    b = CnnBuilder(seed=17)
    y = b.input("image", [1, 3, size, size])
    spatial = size
    layers = ((96, 11, 4, 2, 1, True, True), (256, 5, 1, 2, 2, True, True),
              (384, 3, 1, 1, 1, False, False), (384, 3, 1, 1, 2, False, False),
              (256, 3, 1, 1, 2, False, True))
    channels = 3
    for width, k, stride, pad, groups, lrn, pool in layers:
        y = b.node("Relu", [b.he_conv(y, channels, width, k, stride=stride, pad=pad,
                                      groups=groups, bias=True)])
        spatial = pooled_size(spatial, k, stride, pad)
        if lrn:
            y = b.node("LRN", [y], size=5, alpha=1e-4, beta=0.75, bias=1.0)
        if pool:
            y = b.pool("MaxPool", y, 3, 2)
            spatial = pooled_size(spatial, 3, 2)
        channels = width
    return b.model([_classifier(b, y, channels * spatial * spatial)], "alexnet_lrn")


_MBCONV_STAGES: tuple[tuple[int, int, int, int, int], ...] = (
    # expansion, kernel, stride, output channels, layers
    (1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1),
)


def _squeeze_excite(b: CnnBuilder, x: str, channels: int, squeeze: int) -> str:
    """x * Sigmoid(1x1 conv(SiLU(1x1 conv(global average of x))))."""
    s = b.node("GlobalAveragePool", [x])
    s = b.act(b.he_conv(s, channels, squeeze, 1, bias=True), "SiLU")
    s = b.node("Sigmoid", [b.he_conv(s, squeeze, channels, 1, bias=True, gain=1.0)])
    return b.node("Mul", [x, s])


def efficientnet_b0(size: int) -> onnx.ModelProto:
    """EfficientNet-B0: MBConv blocks (expand 1x1, depthwise 3x3 or 5x5, squeeze-excitation
    to a quarter of the block's input channels, project 1x1), SiLU as x * Sigmoid(x),
    residual sums where shapes allow."""
    b = CnnBuilder(seed=18)
    y = b.conv_bn(b.input("image", [1, 3, size, size]), 3, 32, 3, stride=2, act="SiLU")
    channels = 32
    for expand, k, s, out, layers in _MBCONV_STAGES:
        for i in range(layers):
            stride = s if i == 0 else 1
            hidden = channels * expand
            residual = stride == 1 and channels == out
            h = y if expand == 1 else b.conv_bn(y, channels, hidden, 1, act="SiLU")
            h = b.conv_bn(h, hidden, hidden, k, stride=stride, groups=hidden, act="SiLU")
            h = _squeeze_excite(b, h, hidden, max(1, channels // 4))
            h = b.conv_bn(h, hidden, out, 1, act=None, gain=RESIDUAL_GAIN if residual else 1.0)
            y = b.node("Add", [y, h]) if residual else h
            channels = out
    y = b.conv_bn(y, channels, 1280, 1, act="SiLU")
    return b.model([b.head(y, 1280)], "efficientnet_b0")


# torchvision's MobileNet-v3 blocks: (kernel, expanded, out, squeeze-excitation,
# activation, stride), the input channels being the previous block's output.
_V3_LARGE = ((3, 16, 16, False, "Relu", 1), (3, 64, 24, False, "Relu", 2),
             (3, 72, 24, False, "Relu", 1), (5, 72, 40, True, "Relu", 2),
             (5, 120, 40, True, "Relu", 1), (5, 120, 40, True, "Relu", 1),
             (3, 240, 80, False, "HardSwish", 2), (3, 200, 80, False, "HardSwish", 1),
             (3, 184, 80, False, "HardSwish", 1), (3, 184, 80, False, "HardSwish", 1),
             (3, 480, 112, True, "HardSwish", 1), (3, 672, 112, True, "HardSwish", 1),
             (5, 672, 160, True, "HardSwish", 2), (5, 960, 160, True, "HardSwish", 1),
             (5, 960, 160, True, "HardSwish", 1))
_V3_SMALL = ((3, 16, 16, True, "Relu", 2), (3, 72, 24, False, "Relu", 2),
             (3, 88, 24, False, "Relu", 1), (5, 96, 40, True, "HardSwish", 2),
             (5, 240, 40, True, "HardSwish", 1), (5, 240, 40, True, "HardSwish", 1),
             (5, 120, 48, True, "HardSwish", 1), (5, 144, 48, True, "HardSwish", 1),
             (5, 288, 96, True, "HardSwish", 2), (5, 576, 96, True, "HardSwish", 1),
             (5, 576, 96, True, "HardSwish", 1))


def _divisible8(v: float) -> int:
    """torchvision's ``_make_divisible(v, 8)``: to a multiple of 8, never 10% below ``v``."""
    out = max(8, int(v + 4) // 8 * 8)
    return out + 8 if out < 0.9 * v else out


def _v3_excite(b: CnnBuilder, x: str, channels: int) -> str:
    """x * HardSigmoid(1x1 conv(Relu(1x1 conv(global average of x)))), squeezed to a
    quarter (to a multiple of 8)."""
    squeeze = _divisible8(channels / 4)
    s = b.node("GlobalAveragePool", [x])
    s = b.act(b.he_conv(s, channels, squeeze, 1, bias=True), "Relu")
    s = b.act(b.he_conv(s, squeeze, channels, 1, bias=True, gain=1.0), "HardSigmoid")
    return b.node("Mul", [x, s])


def _mobilenet_v3(size: int, blocks: tuple[tuple[int, int, int, bool, str, int], ...],
                  last: int, hidden: int, name: str) -> onnx.ModelProto:
    """MobileNet-v3 (torchvision): a HardSwish stem, inverted residual blocks with optional
    squeeze-excitation, a 1x1 to ``last`` channels, then Linear ``hidden`` + HardSwish and
    the classifier; opset 14, HardSwish and HardSigmoid as torch exports them."""
    b = CnnBuilder(seed=21, opset=14)
    y = b.conv_bn(b.input("image", [1, 3, size, size]), 3, 16, 3, stride=2, act="HardSwish")
    channels = 16
    for k, expanded, out, excite, act, stride in blocks:
        residual = stride == 1 and channels == out
        h = y if expanded == channels else b.conv_bn(y, channels, expanded, 1, act=act)
        h = b.conv_bn(h, expanded, expanded, k, stride=stride, groups=expanded, act=act)
        if excite:
            h = _v3_excite(b, h, expanded)
        h = b.conv_bn(h, expanded, out, 1, act=None, gain=RESIDUAL_GAIN if residual else 1.0)
        y = b.node("Add", [y, h]) if residual else h
        channels = out
    y = b.conv_bn(y, channels, last, 1, act="HardSwish")
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y])], axis=1)
    y = b.act(b.fc(y, last, hidden), "HardSwish")
    return b.model([b.fc(y, hidden, 1000)], name)


def mobilenet_v3_large(size: int) -> onnx.ModelProto:
    """MobileNet-v3 Large 1.0 (torchvision ``mobilenet_v3_large``)."""
    return _mobilenet_v3(size, _V3_LARGE, 960, 1280, "mobilenet_v3_large")


def mobilenet_v3_small(size: int) -> onnx.ModelProto:
    """MobileNet-v3 Small 1.0 (torchvision ``mobilenet_v3_small``)."""
    return _mobilenet_v3(size, _V3_SMALL, 576, 1024, "mobilenet_v3_small")


ZOO: dict[str, Callable[[int], onnx.ModelProto]] = {
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "densenet121": densenet121,
    "googlenet": googlenet,
    "squeezenet1_1": squeezenet1_1,
    "shufflenet_v2": shufflenet_v2,
    "vgg16": vgg16,
    "alexnet_lrn": alexnet_lrn,
    "efficientnet_b0": efficientnet_b0,
    "mobilenet_v3_large": mobilenet_v3_large,
    "mobilenet_v3_small": mobilenet_v3_small,
}
"""Builders by key; each takes the input size (224 for the published networks)."""


def param_count(model: onnx.ModelProto) -> int:
    """Trainable parameters: conv and fc weights and biases, BatchNorm gamma and beta (not
    its running statistics, nor shape constants and Clip bounds)."""
    total = 0
    for init in model.graph.initializer:
        prefix = re.sub(r"\d+$", "", init.name)
        if prefix in _PARAM_PREFIXES:
            total += math.prod(init.dims)
    return total


def op_types(model: onnx.ModelProto) -> dict[str, int]:
    """How many nodes of each op type ``model`` has."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def _check(key: str, size: int) -> str:
    from onnx_support import ort_run, random_feeds

    model = ZOO[key](size)
    (logits,) = ort_run(model, random_feeds(model))
    finite = bool(np.isfinite(logits).all())
    params = param_count(model)
    published = PUBLISHED_PARAMS[key]
    return (f"{key:16s} params {params:>11,} (published {published:>11,}, "
            f"{params / published - 1:+.2%}) logits {logits.shape} max|y| "
            f"{float(np.abs(logits).max()):.3g} finite {finite}")


def main(argv: Sequence[str] | None = None) -> int:
    """Print each model's parameter count against the published one and check that
    onnxruntime runs it to finite logits at ``--size``."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--only", choices=sorted(ZOO), default=None)
    args: Any = parser.parse_args(argv)
    for key in ZOO:
        if args.only in (None, key):
            print(_check(key, args.size), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
