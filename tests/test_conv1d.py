"""1-D convolutions (Whisper's and wav2vec's front ends, TCNs) run as conv2d kernels of
height 1, with the same fused followers as a 2-D Conv, and match onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("onnxruntime")

from onnx_support import compile_and_compare

from tunecache.compiler.frontend import load_graph


def _constant(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)


def _whisper_front(length: int = 40, mels: int = 8, width: int = 16) -> onnx.ModelProto:
    """Whisper's audio front end in small: Conv1d(k3, pad 1) -> Gelu -> Conv1d(k3, stride 2,
    pad 1) -> Gelu, then a BatchNorm'd pointwise Conv1d with a residual Add and a Relu, and
    a grouped, dilated Conv1d."""
    rng = np.random.default_rng(0)
    half = (length + 1) // 2
    inits = [_constant(rng, "w1", width, mels, 3), _constant(rng, "b1", width),
             _constant(rng, "w2", width, width, 3), _constant(rng, "b2", width),
             _constant(rng, "w3", width, width, 1),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, width).astype(np.float32), "g"),
             _constant(rng, "beta", width), _constant(rng, "mean", width),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, width).astype(np.float32), "var"),
             _constant(rng, "w4", width, width // 4, 5)]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1], name="conv1"),
        helper.make_node("Gelu", ["c1"], ["g1"], name="gelu1"),
        helper.make_node("Conv", ["g1", "w2", "b2"], ["c2"], pads=[1, 1], strides=[2],
                         name="conv2"),
        helper.make_node("Gelu", ["c2"], ["g2"], name="gelu2"),
        helper.make_node("Conv", ["g2", "w3"], ["c3"], name="pointwise"),
        helper.make_node("BatchNormalization", ["c3", "g", "beta", "mean", "var"], ["n3"],
                         name="bn"),
        helper.make_node("Add", ["n3", "g2"], ["r3"], name="residual"),
        helper.make_node("Relu", ["r3"], ["a3"], name="relu"),
        helper.make_node("Conv", ["a3", "w4"], ["y"], group=4, dilations=[2],
                         pads=[4, 4], name="grouped"),
    ]
    graph = helper.make_graph(
        nodes, "whisper_front",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, mels, length])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width, half])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)],
                             ir_version=9)


def test_conv1d_stack_runs_as_kernels_and_matches_onnxruntime(tmp_path: Path) -> None:
    model = _whisper_front()
    path = tmp_path / "front.onnx"
    onnx.save(model, str(path))
    graph = load_graph(path)
    convs = [k for k in graph.kernel_nodes if k.op.kind == "conv2d"]
    assert len(convs) == 4
    assert all(k.op.arguments()[0].shape[2] == 1 for k in convs)  # height 1
    pointwise = next(k for k in convs if "pointwise" in k.nodes)
    assert {"bn", "residual", "relu"} <= set(pointwise.nodes)
    assert pointwise.op.epilogue == ("bias", "add", "relu")
    assert not [n for n in graph.onnx_nodes if n.op_type == "Conv"]
    compile_and_compare(model, tmp_path)


def test_conv1d_with_weights_given_at_run_time_stays_in_numpy(tmp_path: Path) -> None:
    """Weights given at run time cannot be viewed as a height-1 kernel's: numpy runs
    the node, and its note says why."""
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1], name="conv")],
        "runtime_weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 12]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [6, 4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 12])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    loaded = load_graph(path)
    conv = next(n for n in loaded.onnx_nodes if n.op_type == "Conv")
    assert "not a constant" in conv.note
    compile_and_compare(model, tmp_path)
