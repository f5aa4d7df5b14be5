"""Quantized activations between int8 kernels (issue 53): a kernel whose readers all take
uint8 writes its output quantized, a byte an element, and they read the bytes
(:mod:`tunecache.compiler.lowering.u8`); each epilogue's runs of per-channel multiplies and
adds are composed into one of each (:mod:`tunecache.compiler.lowering.affine`). On an
onnxruntime-quantized bottleneck block: which tensors go uint8, and that the model still
agrees with onnxruntime running the same file to within one quantization step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_support import quantization_steps, quantize_qdq

from tunecache.compiler import frontend
from tunecache.compiler.codegen.epilogue import RESIDUAL_STEP
from tunecache.compiler.graph import KernelNode
from tunecache.compiler.kinds import narrow_tensors
from tunecache.compiler.lowering import affine, u8
from tunecache.tuner.deploy import compile_model

SHAPE = (1, 16, 10, 10)


def _bottleneck(path: Path) -> Path:
    """x -> Conv 3x3 + Relu (s) -> [Conv 1x1 + BN + Relu -> Conv 3x3 + BN + Relu -> Conv 1x1
    + BN] + s -> Relu -> Conv 1x1 (y): ResNet's block after a stem, BatchNormalization left
    unfolded as onnxruntime's quantizer leaves it."""
    rng = np.random.default_rng(41)
    inits: list[onnx.TensorProto] = []
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["s"])]
    inits += _conv_weights(rng, "0", 16, 16, 3)
    source = "s"
    for i, (f, k) in enumerate(((8, 1), (8, 3), (16, 1)), start=1):
        c = 16 if i == 1 else 8
        pad = [k // 2] * 4
        nodes += [helper.make_node("Conv", [source, f"w{i}", f"b{i}"], [f"c{i}"], pads=pad),
                  helper.make_node("BatchNormalization", [f"c{i}", f"g{i}", f"be{i}",
                                                          f"mu{i}", f"v{i}"], [f"n{i}"])]
        inits += _conv_weights(rng, str(i), f, c, k) + _batchnorm(rng, str(i), f)
        source = f"n{i}"
        if i < 3:
            nodes.append(helper.make_node("Relu", [source], [f"r{i}"]))
            source = f"r{i}"
    nodes += [helper.make_node("Add", ["n3", "s"], ["a"]),
              helper.make_node("Relu", ["a"], ["r"]),
              helper.make_node("Conv", ["r", "w4", "b4"], ["y"])]
    inits += _conv_weights(rng, "4", 16, 16, 1)
    graph = helper.make_graph(
        nodes, "bottleneck", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _conv_weights(rng: np.random.Generator, i: str, f: int, c: int, k: int
                  ) -> list[onnx.TensorProto]:
    w = rng.standard_normal((f, c, k, k)) / np.sqrt(c * k * k)
    return [numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
            numpy_helper.from_array((rng.random(f) * 0.1).astype(np.float32), f"b{i}")]


def _batchnorm(rng: np.random.Generator, i: str, f: int) -> list[onnx.TensorProto]:
    values = {"g": 0.5 + rng.random(f), "be": rng.standard_normal(f) * 0.1,
              "mu": rng.standard_normal(f) * 0.1, "v": 0.5 + rng.random(f)}
    return [numpy_helper.from_array(v.astype(np.float32), f"{k}{i}") for k, v in values.items()]


@pytest.fixture
def quantized(tmp_path: Path) -> Path:
    pytest.importorskip("onnxruntime.quantization")
    rng = np.random.default_rng(42)
    return quantize_qdq(_bottleneck(tmp_path / "block.onnx"), tmp_path / "block.int8.onnx",
                        [{"x": rng.standard_normal(SHAPE).astype(np.float32)}
                         for _ in range(4)])


def _convs(path: Path) -> list[KernelNode]:
    graph = frontend.load_graph(path)
    convs = [n for n in graph.kernel_nodes if n.op.kind == "conv2d"]
    if not convs or convs[0].op.dtype != "int8":
        pytest.skip("this CPU runs QDQ products as float32 kernels (no int8 dot product)")
    assert [n.op.kind for n in graph.kernel_nodes] == ["conv2d"] * 5  # no pair left apart
    return convs


def test_activations_between_int8_convolutions_are_uint8(quantized: Path) -> None:
    held = [narrow_tensors(n.op) for n in _convs(quantized)]
    # The stem reads the float32 input; the last writes the float32 output; the block's
    # residual is the stem's output, added from its bytes.
    assert held == [{"y"}, {"x", "y"}, {"x", "y"}, {"x", "y", "add"}, {"x"}]
    residual = _convs(quantized)[3]
    assert RESIDUAL_STEP in residual.op.epilogue and residual.inputs.count("s") == 0


def test_epilogue_runs_are_composed(quantized: Path) -> None:
    # Between the clamps and roundings only one multiply and one add are left: no divide.
    for node in _convs(quantized):
        assert "cdiv" not in node.op.epilogue, node.op.epilogue
        pairs = set(zip(node.op.epilogue, node.op.epilogue[1:], strict=False))
        assert ("cmul", "cmul") not in pairs


def _steps_from_onnxruntime(path: Path, tmp_path: Path, seed: int) -> float:
    x = np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)
    ours = compile_model(path, store=tmp_path / "store", policy="analytic").run({"x": x})["y"]
    return quantization_steps(path, {"x": x}, ours)


def test_the_block_agrees_with_onnxruntime(quantized: Path, tmp_path: Path) -> None:
    _convs(quantized)
    for seed in (1, 2, 3):
        steps = _steps_from_onnxruntime(quantized, tmp_path, seed)
        assert steps <= 1.0 + 1e-4, f"{steps:.3f} quantization steps apart"


def test_without_the_passes_the_same_model_agrees_too(quantized: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # The passes change where values are stored and how epilogues round, not what they are.
    monkeypatch.setattr(u8, "_rewrite", lambda *args: None)
    monkeypatch.setattr(affine, "_composed", lambda *args: None)
    graph = frontend.load_graph(quantized)
    assert not any(narrow_tensors(n.op) for n in graph.kernel_nodes if n.op.kind == "conv2d")
    steps = _steps_from_onnxruntime(quantized, tmp_path, 1)
    assert steps <= 1.0 + 1e-4, f"{steps:.3f} quantization steps apart"


def _requantized(path: Path) -> Path:
    """x -> pair -> Reshape -> pair -> Transpose -> pair (e) -> Mul 2 -> pair (y): the
    pairs onnxruntime's quantizer leaves after data movement, all of one scale and zero
    point but the last; e is an output too."""
    scale = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    zero = numpy_helper.from_array(np.array(3, np.uint8), "z")
    other = numpy_helper.from_array(np.array(0.1, np.float32), "s2")
    shape = numpy_helper.from_array(np.array([1, 8, 6, 4], np.int64), "shape")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes: list[onnx.NodeProto] = []

    def pair(src: str, dst: str, s: str = "s") -> None:
        nodes.extend([helper.make_node("QuantizeLinear", [src, s, "z"], [dst + "_q"]),
                      helper.make_node("DequantizeLinear", [dst + "_q", s, "z"], [dst])])

    pair("x", "a")
    nodes.append(helper.make_node("Reshape", ["a", "shape"], ["b"]))
    pair("b", "c")
    nodes.append(helper.make_node("Transpose", ["c"], ["d"], perm=[0, 2, 1, 3]))
    pair("d", "e")
    nodes.append(helper.make_node("Mul", ["e", "two"], ["f"]))
    pair("f", "y", "s2")
    graph = helper.make_graph(
        nodes, "requantized", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 24])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 6, 8, 4])
         for name in ("e", "y")], [scale, zero, other, shape, two])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), path)
    return path


def test_a_pair_on_values_already_on_its_grid_is_dropped(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    path = _requantized(tmp_path / "requantized.onnx")
    steps = frontend.load_graph(path).steps
    kinds = [getattr(s, "op_type", None) or s.op.kind for s in steps]
    assert kinds.count("Identity") == 2  # the pairs after Reshape and Transpose
    x = np.random.default_rng(5).uniform(-4, 10, (8, 24)).astype(np.float32)
    ours = compile_model(path, store=tmp_path / "store", policy="analytic").run({"x": x})
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    for name, want in zip(("e", "y"), theirs, strict=True):
        np.testing.assert_array_equal(ours[name], want)  # the pairs were identities


def _pooled(path: Path) -> Path:
    """x -> Conv 3x3 + Relu -> MaxPool 3x3 stride 2 -> Conv 1x1 + Relu, Conv 3x3 (two
    readers of the pool) -> Add -> y: ResNet's stem and first convolutions, narrowed."""
    rng = np.random.default_rng(43)
    inits = (_conv_weights(rng, "0", 32, 16, 3) + _conv_weights(rng, "1", 32, 32, 1)
             + _conv_weights(rng, "2", 32, 32, 3))
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("MaxPool", ["r0"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p", "w1", "b1"], ["c1"]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["p", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["r1", "c2"], ["y"])]
    out = (1, 32, 5, 5)
    graph = helper.make_graph(
        nodes, "pooled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_max_pool_between_int8_convolutions_hands_the_bytes_on(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime.quantization")
    rng = np.random.default_rng(44)
    path = quantize_qdq(_pooled(tmp_path / "pooled.onnx"), tmp_path / "pooled.int8.onnx",
                        [{"x": rng.standard_normal(SHAPE).astype(np.float32)}
                         for _ in range(4)])
    graph = frontend.load_graph(path)
    kinds = {n.op.kind: n for n in graph.kernel_nodes}
    if kinds["conv2d"].op.dtype != "int8":
        pytest.skip("this CPU runs QDQ products as float32 kernels (no int8 dot product)")
    pool = kinds["pool2d"]
    assert (pool.op.dtype, pool.op.attr("narrow")) == ("int8", "x+y")
    assert [a.dtype for a in pool.op.arguments()] == ["uint8", "uint8"]
    writer = next(n for n in graph.kernel_nodes if n.output == pool.inputs[0])
    assert "y" in narrow_tensors(writer.op)
    readers = [n for n in graph.kernel_nodes if pool.output in n.inputs]
    assert len(readers) == 2 and all("x" in narrow_tensors(n.op) for n in readers)
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)
        ours = compile_model(path, store=tmp_path / "store", policy="analytic").run({"x": x})
        steps = quantization_steps(path, {"x": x}, ours["y"])
        assert steps <= 1.0 + 1e-4, f"{steps:.3f} quantization steps apart"
