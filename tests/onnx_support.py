"""ONNX models built with onnx.helper for the frontend/executor tests, and comparison helpers.

Small spatial sizes keep the tests fast; every model is deterministic for its seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


class Builder:
    """Collects nodes and initializers; ``model()`` makes the ModelProto."""

    def __init__(self, opset: int, seed: int = 0) -> None:
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def input(self, name: str, shape: Sequence[int | str], dtype: int = F32) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        return name

    def const(self, array: np.ndarray, prefix: str = "c") -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, *shape: int, scale: float | None = None, prefix: str = "w") -> str:
        fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
        std = scale if scale is not None else 1.0 / math.sqrt(fan_in)
        return self.const((self.rng.standard_normal(shape) * std).astype(np.float32), prefix)

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.asarray(values, dtype=np.int64), "i")

    def node(self, op: str, inputs: Sequence[str], n_out: int = 1, name: str | None = None,
             **attrs: Any) -> Any:
        name = name or self.name(op.lower())
        outs = [f"{name}_out{i}" if i else f"{name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    # -- composite pieces -------------------------------------------------------------------

    def bn(self, x: str, channels: int, name: str | None = None) -> str:
        r = self.rng
        scale = self.const((1 + 0.2 * r.standard_normal(channels)).astype(np.float32), "gamma")
        bias = self.const((0.1 * r.standard_normal(channels)).astype(np.float32), "beta")
        mean = self.const((0.1 * r.standard_normal(channels)).astype(np.float32), "mean")
        var = self.const((0.5 + r.random(channels)).astype(np.float32), "var")
        return self.node("BatchNormalization", [x, scale, bias, mean, var], name=name,
                         epsilon=1e-5)

    def conv(self, x: str, c_in: int, c_out: int, k: int, *, stride: int = 1, pad: int | None = None,
             groups: int = 1, bias: bool = False, name: str | None = None, **attrs: Any) -> str:
        w = self.weight(c_out, c_in // groups, k, k)
        inputs = [x, w]
        if bias:
            inputs.append(self.const((0.1 * self.rng.standard_normal(c_out)).astype(np.float32), "b"))
        if pad is None and "auto_pad" not in attrs:
            pad = k // 2
        if pad is not None:
            attrs["pads"] = [pad] * 4
        return self.node("Conv", inputs, name=name, kernel_shape=[k, k], strides=[stride, stride],
                         group=groups, **attrs)

    def unsqueeze(self, x: str, axes: Sequence[int]) -> str:
        if self.opset >= 13:
            return self.node("Unsqueeze", [x, self.ints(axes)])
        return self.node("Unsqueeze", [x], axes=list(axes))

    def reduce_mean(self, x: str, axes: Sequence[int]) -> str:
        if self.opset >= 18:
            return self.node("ReduceMean", [x, self.ints(axes)], keepdims=1)
        return self.node("ReduceMean", [x], axes=list(axes), keepdims=1)

    def clip(self, x: str, lo: float, hi: float) -> str:
        if self.opset >= 11:
            return self.node("Clip", [x, self.const(np.float32(lo)), self.const(np.float32(hi))])
        return self.node("Clip", [x], min=lo, max=hi)

    def model(self, outputs: Sequence[str], name: str = "test") -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, F32, None) for o in outputs]
        graph = helper.make_graph(self.nodes, name, self.inputs, outs, self.inits)
        # IR 8 is read by every onnxruntime this project supports, whatever the opset.
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                 ir_version=8)


# -- models --------------------------------------------------------------------------------


def resnet_model(opset: int = 13, batch: int = 1, width: int = 8) -> onnx.ModelProto:
    """A tiny ResNet: stem conv+BN+Relu, MaxPool, an identity block, a projection block with
    stride 2, GlobalAveragePool, Flatten, Gemm (transB); ``width`` channels, twice as many
    after the projection."""
    b = Builder(opset, seed=1)
    w1, w2 = width, 2 * width
    x = b.input("image", [batch, 3, 16, 16])
    y = b.node("Relu", [b.bn(b.conv(x, 3, w1, 3, stride=2, name="stem"), w1, name="stem_bn")],
               name="stem_relu")
    y = b.node("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    # identity block: conv-bn-relu, conv-bn, add, relu
    t = b.node("Relu", [b.bn(b.conv(y, w1, w1, 3, name="b1_conv1"), w1, name="b1_bn1")],
               name="b1_relu1")
    t = b.bn(b.conv(t, w1, w1, 3, name="b1_conv2"), w1, name="b1_bn2")
    y = b.node("Relu", [b.node("Add", [t, y], name="b1_add")], name="b1_relu2")
    # projection block: stride-2 conv with bias, shortcut 1x1 conv + BN
    t = b.node("Relu", [b.bn(b.conv(y, w1, w2, 3, stride=2, bias=True, name="b2_conv1"), w2,
                             name="b2_bn1")], name="b2_relu1")
    t = b.bn(b.conv(t, w2, w2, 3, name="b2_conv2"), w2, name="b2_bn2")
    s = b.bn(b.conv(y, w1, w2, 1, stride=2, pad=0, name="b2_short"), w2, name="b2_short_bn")
    y = b.node("Relu", [b.node("Add", [s, t], name="b2_add")], name="b2_relu2")
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y])], axis=1)
    w = b.weight(10, w2, prefix="fc_w")
    logits = b.node("Gemm", [y, w, b.const(np.linspace(-1, 1, 10, dtype=np.float32), "fc_b")],
                    name="fc", transB=1)
    return b.model([logits], "tiny_resnet")


def mobilenet_model(opset: int = 13) -> onnx.ModelProto:
    """MobileNet-v2-style inverted residual blocks: 1x1 expand + BN + ReLU6 (Clip), 3x3
    depthwise + BN + ReLU6, 1x1 project + BN (+ residual Add), and a SAME_UPPER strided
    depthwise with a channel multiplier."""
    b = Builder(opset, seed=2)
    x = b.input("x", [1, 8, 10, 10])
    t = b.clip(b.bn(b.conv(x, 8, 24, 1, pad=0, name="expand"), 24), 0.0, 6.0)
    t = b.clip(b.bn(b.conv(t, 24, 24, 3, groups=24, name="dw"), 24), 0.0, 6.0)
    t = b.bn(b.conv(t, 24, 8, 1, pad=0, name="project"), 8, name="project_bn")
    y = b.node("Add", [x, t], name="residual")
    t = b.node("Relu", [b.bn(b.conv(y, 8, 16, 3, stride=2, groups=8, name="dw2",
                                    auto_pad="SAME_UPPER"), 16)], name="dw2_relu")
    t = b.conv(t, 16, 16, 3, pad=None, groups=16, name="dw3", auto_pad="VALID", bias=True)
    return b.model([y, t], "tiny_mobilenet")


def bert_layer_model(opset: int = 17, layer_norm_op: bool = True, batch: int = 2, seq: int = 8,
                     hidden: int = 32, heads: int = 4, layers: int = 1) -> onnx.ModelProto:
    """A BERT encoder layer (``layers`` of them in a row: a BERT encoder): QKV projections,
    multi-head attention with an additive mask, softmax, output projection, residual +
    layer norm, GELU (Erf) feed-forward, residual + layer norm. ``layer_norm_op`` uses
    LayerNormalization (opset >= 17), else the ReduceMean/Sub/Pow/Sqrt/Div decomposition
    exporters emit for older opsets. The first layer's nodes are named ``query``, ``ln1``...;
    later layers' add ``_<layer>``."""
    b = Builder(opset, seed=3)
    x = b.input("hidden", [batch, seq, hidden])
    mask = b.input("mask", [batch, 1, 1, seq])
    out = x
    for layer in range(layers):
        out = _bert_layer(b, out, mask, hidden, heads, layer_norm_op, f"_{layer}" if layer else "")
    return b.model([out], "bert_layer" if layers == 1 else f"bert_{layers}_layers")


def _bert_layer(b: Builder, x: str, mask: str, hidden: int, heads: int, layer_norm_op: bool,
                suffix: str) -> str:
    opset, dh = b.opset, hidden // heads

    def linear(t: str, n_in: int, n_out: int, name: str) -> str:
        mm = b.node("MatMul", [t, b.weight(n_in, n_out)], name=name + suffix)
        bias = b.const((0.1 * b.rng.standard_normal(n_out)).astype(np.float32), f"{name}_bias")
        return b.node("Add", [mm, bias], name=f"{name}_add{suffix}")

    # [batch, -1, heads, dh] from the input's batch size (a Shape/Gather/Concat chain, folded)
    batch_dim = b.unsqueeze(b.node("Gather", [b.node("Shape", [x]),
                                              b.const(np.array(0, dtype=np.int64))], axis=0), [0])
    split_shape = b.node("Concat", [batch_dim, b.ints([-1, heads, dh])], axis=0)

    def heads_of(t: str, perm: Sequence[int]) -> str:
        return b.node("Transpose", [b.node("Reshape", [t, split_shape])], perm=list(perm))

    q = heads_of(linear(x, hidden, hidden, "query"), [0, 2, 1, 3])
    k = heads_of(linear(x, hidden, hidden, "key"), [0, 2, 3, 1])
    v = heads_of(linear(x, hidden, hidden, "value"), [0, 2, 1, 3])
    scores = b.node("MatMul", [q, k], name="scores" + suffix)
    scores = b.node("Div", [scores, b.const(np.float32(math.sqrt(dh)))])
    scores = b.node("Add", [scores, mask])
    probs = b.node("Softmax", [scores], axis=3 if opset < 13 else -1)
    ctx = b.node("MatMul", [probs, v], name="context" + suffix)
    ctx = b.node("Transpose", [ctx], perm=[0, 2, 1, 3])
    ctx = b.node("Reshape", [ctx, b.node("Shape", [x])])

    def layer_norm(t: str, name: str) -> str:
        gamma = b.const((1 + 0.1 * b.rng.standard_normal(hidden)).astype(np.float32), "ln_g")
        beta = b.const((0.1 * b.rng.standard_normal(hidden)).astype(np.float32), "ln_b")
        if layer_norm_op:
            return b.node("LayerNormalization", [t, gamma, beta], name=name + suffix, axis=-1,
                          epsilon=1e-12)
        mean = b.reduce_mean(t, [-1])
        d = b.node("Sub", [t, mean])
        var = b.reduce_mean(b.node("Pow", [d, b.const(np.float32(2.0))]), [-1])
        std = b.node("Sqrt", [b.node("Add", [var, b.const(np.float32(1e-12))])])
        return b.node("Add", [b.node("Mul", [b.node("Div", [d, std]), gamma]), beta],
                      name=name + suffix)

    attn = layer_norm(b.node("Add", [linear(ctx, hidden, hidden, "attn_out"), x]), "ln1")
    h = linear(attn, hidden, 4 * hidden, "ffn_in")
    gelu = b.node("Mul", [b.node("Mul", [h, b.const(np.float32(0.5))]),
                          b.node("Add", [b.const(np.float32(1.0)), b.node(
                              "Erf", [b.node("Div", [h, b.const(np.float32(math.sqrt(2)))])])])])
    return layer_norm(b.node("Add", [linear(gelu, 4 * hidden, hidden, "ffn_out"), attn]), "ln2")


def mlp_model(opset: int = 9) -> onnx.ModelProto:
    """Gemm variants: transB with a bias + Relu, alpha/beta with constants (pre-scaled),
    transA with a computed A, a Gemm whose C is a full matrix (numpy fallback), Dropout,
    Sigmoid, Tanh and a 2-D Softmax."""
    b = Builder(opset, seed=4)
    x = b.input("x", [4, 2, 3, 4])
    t = b.node("Flatten", [x], axis=1)                                      # [4, 24]
    t = b.node("Relu", [b.node("Gemm", [t, b.weight(16, 24), b.weight(16, scale=0.1)],
                               name="fc1", transB=1)], name="fc1_relu")
    t = b.node("Dropout", [t], ratio=0.3) if opset < 12 else b.node("Dropout", [t])
    t = b.node("Gemm", [t, b.weight(16, 12), b.weight(1, 12, scale=0.1)], name="fc2",
               alpha=0.5, beta=2.0)
    t = b.node("Sigmoid", [t])                                               # [4, 12]
    tt = b.node("Transpose", [t], perm=[1, 0])                               # [12, 4]
    u = b.node("Gemm", [tt, b.weight(12, 6), b.const(np.float32(0.25))], name="fc3",
               transA=1, beta=0.5)                                           # [4, 6]
    u = b.node("Gemm", [u, b.weight(6, 6), b.weight(4, 6, scale=0.1)], name="fc4")
    u = b.node("Tanh", [u])
    return b.model([b.node("Softmax", [u], axis=1)], "mlp")


def op_model(op: str, x: Sequence[int | str], inits: Mapping[str, np.ndarray], *,
             follow: str | None = None, opset: int = 17, ir_version: int = 8,
             **attrs: Any) -> onnx.ModelProto:
    """``y = op(x, *inits)`` with float input ``x`` and constant ``inits`` (in order), then
    ``follow`` (a unary op) on its result when given."""
    nodes = [helper.make_node(op, ["x", *inits], ["t" if follow else "y"], **attrs)]
    if follow:
        nodes.append(helper.make_node(follow, ["t"], ["y"]))
    graph = helper.make_graph(
        nodes, op.lower(), [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=ir_version)


def ort_run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs for ``feeds`` (basic optimisations, one thread)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def quantize_qdq(source: Any, out: Any, batches: Sequence[Mapping[str, np.ndarray]]) -> Any:
    """``source`` quantized by onnxruntime into ``out`` as most quantized models are: static
    QDQ, uint8 activations, int8 per-channel weights, calibrated on ``batches``."""
    from onnxruntime import quantization as q

    class Calibration(q.CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.feeds = iter([dict(b) for b in batches])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    q.quantize_static(str(source), str(out), Calibration(), quant_format=q.QuantFormat.QDQ,
                      per_channel=True, activation_type=q.QuantType.QUInt8,
                      weight_type=q.QuantType.QInt8)
    return out


def quantization_steps(path: Any, feeds: Mapping[str, np.ndarray], ours: np.ndarray,
                       output: str = "y") -> float:
    """How many of ``output``'s quantization steps (the scale of the ``DequantizeLinear``
    writing it) ``ours`` is from onnxruntime's reference path (no graph optimisations) on
    ``feeds``, at most."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    theirs = session.run([output], dict(feeds))[0]
    model = onnx.load(str(path))
    scales = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    last = next(n for n in model.graph.node if n.output[0] == output)
    return float((np.abs(ours - theirs) / float(scales[last.input[1]])).max())


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal float32 inputs for every declared model input (static shapes)."""
    rng = np.random.default_rng(seed)
    init = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def assert_close(actual: Mapping[str, np.ndarray], expected: Sequence[np.ndarray],
                 names: Sequence[str], rtol: float = 1e-4, atol: float = 1e-4) -> None:
    assert list(actual) == list(names)
    for name, want in zip(names, expected, strict=True):
        got = actual[name]
        assert got.shape == want.shape, (name, got.shape, want.shape)
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)


def resnet50_model(batch: int = 1, size: int = 224) -> onnx.ModelProto:
    """ResNet-50 v1.5 (torchvision layout, opset 13): 53 convs with BatchNorm, ~25.6M
    parameters of random weights; for load-time measurements."""
    b = Builder(13, seed=5)
    x = b.input("image", [batch, 3, size, size])
    y = b.node("Relu", [b.bn(b.conv(x, 3, 64, 7, stride=2), 64)])
    y = b.node("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            s = stride if i == 0 else 1
            t = b.node("Relu", [b.bn(b.conv(y, c_in, width, 1, pad=0), width)])
            t = b.node("Relu", [b.bn(b.conv(t, width, width, 3, stride=s), width)])
            t = b.bn(b.conv(t, width, 4 * width, 1, pad=0), 4 * width)
            short = y if i else b.bn(b.conv(y, c_in, 4 * width, 1, stride=s, pad=0), 4 * width)
            y = b.node("Relu", [b.node("Add", [t, short])])
            c_in = 4 * width
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y])], axis=1)
    y = b.node("Gemm", [y, b.weight(1000, 2048), b.weight(1000, scale=0.01)], transB=1)
    return b.model([y], "resnet50")


def mobilenet_v2_model(size: int = 224) -> onnx.ModelProto:
    """MobileNet-v2 (batch 1, width 1.0, opset 13) with ReLU where the original has ReLU6,
    as the suites list it; BatchNorm after every conv, random weights."""
    b = Builder(13, seed=7)
    x = b.input("image", [1, 3, size, size])
    y = b.node("Relu", [b.bn(b.conv(x, 3, 32, 3, stride=2), 32)])
    c_in = 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = c_in * t
            h = y
            if t != 1:
                h = b.node("Relu", [b.bn(b.conv(h, c_in, hidden, 1, pad=0), hidden)])
            h = b.node("Relu", [b.bn(b.conv(h, hidden, hidden, 3, stride=stride,
                                            groups=hidden), hidden)])
            h = b.bn(b.conv(h, hidden, c, 1, pad=0), c)
            y = b.node("Add", [y, h]) if stride == 1 and c_in == c else h
            c_in = c
    y = b.node("Relu", [b.bn(b.conv(y, c_in, 1280, 1, pad=0), 1280)])
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y])], axis=1)
    y = b.node("Gemm", [y, b.weight(1000, 1280), b.weight(1000, scale=0.01)], transB=1)
    return b.model([y], "mobilenet_v2")


def fusion_cases_model(opset: int = 13) -> onnx.ModelProto:
    """Convolutions and matmuls whose neighbours fuse, or must not:

    * ``c_dil``: dilation 2, asymmetric pads, stride (1, 2), bias, + per-channel constant Add
      (folded into the bias) + Relu;
    * ``c_grp``: SAME_LOWER stride 2, groups 2, + BN + residual Add whose other operand
      (``c_side``) is computed after ``c_grp`` in node order;
    * ``c_twice``: output used twice (no fusion); ``c_out``: output is a graph output
      (its Relu stays separate);
    * ``mm_rows``: [2,3,5,4] . [4,6] -> one matmul (M=30) + bias (1,1,6) + Relu;
    * ``mm_shared_a``: constant [5,4] . batched [2,4,6] -> batch_matmul shared=a;
    * ``mm_shared_b``: batched [2,5,4] . computed [4,6] -> matmul over rows;
    * ``mm_vec``: [2,5,4] . [4] (no bias fusion: the output has no N axis);
    * ``mm_bcast``: [2,1,5,4] . [1,3,4,6] -> numpy fallback;
    * ``gemm_alpha``: alpha with no constant operand -> numpy fallback.
    """
    b = Builder(opset, seed=6)
    x = b.input("x", [1, 6, 9, 8])
    m = b.input("m", [2, 3, 5, 4])
    w = b.weight(4, 6, 3, 3)
    bias = b.const(np.linspace(-0.2, 0.2, 4, dtype=np.float32), "b")
    t = b.node("Conv", [x, w, bias], name="c_dil", kernel_shape=[3, 3], dilations=[2, 2],
               pads=[0, 1, 2, 1], strides=[1, 2])                                  # [1,4,5,4]
    t = b.node("Add", [t, b.const(np.float32([0.1, -0.1, 0.2, 0.0]).reshape(1, 4, 1, 1))],
               name="c_dil_add")
    dil = b.node("Relu", [t], name="c_dil_relu")
    g = b.conv(x, 6, 4, 3, stride=2, groups=2, pad=None, auto_pad="SAME_LOWER", name="c_grp")
    g = b.bn(g, 4, name="c_grp_bn")                                                # [1,4,5,4]
    side = b.conv(x, 6, 4, 3, stride=2, name="c_side")                            # [1,4,5,4]
    res = b.node("Add", [side, g], name="c_grp_add")
    twice = b.conv(dil, 4, 4, 1, pad=0, name="c_twice")
    twice = b.node("Mul", [b.node("Relu", [twice], name="c_twice_relu"), twice])
    out = b.conv(res, 4, 4, 1, pad=0, name="c_out")
    out_relu = b.node("Relu", [out], name="c_out_relu")

    rows = b.node("MatMul", [m, b.weight(4, 6)], name="mm_rows")
    rows = b.node("Add", [rows, b.const(np.linspace(0, 1, 6, dtype=np.float32).reshape(1, 1, 6))],
                  name="mm_rows_add")
    rows = b.node("Relu", [rows], name="mm_rows_relu")                             # [2,3,5,6]
    m3 = b.node("Reshape", [m, b.ints([6, 5, 4])])
    at = b.node("Transpose", [m3], perm=[0, 2, 1])                                 # [6,4,5]
    shared_a = b.node("MatMul", [b.weight(5, 4), at], name="mm_shared_a")          # [6,5,5]
    col = b.node("Reshape", [b.node("ReduceMax", [m], axes=[0, 1, 2], keepdims=0),
                             b.ints([4, 1])])
    computed_b = b.node("Mul", [col, b.weight(4, 6)])                              # [4,6]
    shared_b = b.node("MatMul", [m3, computed_b], name="mm_shared_b")             # [6,5,6]
    vec = b.node("MatMul", [m3, b.weight(4)], name="mm_vec")                        # [6,5]
    vec = b.node("Add", [vec, b.weight(5)], name="mm_vec_add")
    bcast = b.node("MatMul", [b.node("Reshape", [m, b.ints([2, 3, 5, 4])]),
                              b.weight(1, 3, 4, 6)], name="mm_bcast")
    bcast2 = b.node("MatMul", [b.node("Reshape", [m, b.ints([6, 1, 5, 4])]),
                               b.weight(1, 3, 4, 6)], name="mm_bcast2")            # [6,3,5,6]
    flat = b.node("Reshape", [m, b.ints([6, 20])])
    alpha = b.node("Gemm", [flat, b.node("Transpose", [flat], perm=[1, 0])], name="gemm_alpha",
                   alpha=0.5)
    return b.model([dil, out, out_relu, twice, rows, shared_a, shared_b, vec, bcast, bcast2,
                    alpha], "fusion_cases")


def compile_and_compare(model: onnx.ModelProto, tmp_path: Any,
                        feeds: Mapping[str, np.ndarray] | None = None) -> Any:
    """Compile ``model`` under ``tmp_path`` (analytic schedules, real kernel builds), check
    every planned node got a kernel and that the outputs match onnxruntime's; returns the
    compiled model."""
    from tunecache.cache.store import Store
    from tunecache.tuner.deploy import compile_model

    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(path, store=Store(tmp_path / "store"), policy="analytic")
    assert all(e.node in compiled.kernels for e in compiled.plan)
    feeds = feeds or random_feeds(model)
    assert_close(compiled.run(feeds), ort_run(model, feeds), [o.name for o in model.graph.output])
    return compiled
