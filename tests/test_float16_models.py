"""float16 models compute in float32 (issue 53): their Conv/MatMul/Gemm run as the float32
kernels, the interface stays float16, and the outputs agree with onnxruntime's on the same
file to float16's precision."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tunecache.compiler import frontend
from tunecache.compiler.graph import ModelError
from tunecache.tuner.deploy import compile_model

ort = pytest.importorskip("onnxruntime")


def _fp16_cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float16)
    w2 = (rng.standard_normal((256, 10)) * 0.1).astype(np.float16)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["f"]),
             helper.make_node("Gemm", ["f", "w2"], ["g"]),
             helper.make_node("Cast", ["g"], ["g32"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["g32"], ["y"], to=TensorProto.FLOAT16)]
    graph = helper.make_graph(
        nodes, "fp16_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 8, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 10])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w2, "w2"),
         numpy_helper.from_array(np.array([1, 256], np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_float16_model_runs_its_products_as_float32_kernels(tmp_path: Path) -> None:
    path = tmp_path / "fp16.onnx"
    onnx.save(_fp16_cnn(), path)
    graph = frontend.load_graph(path)
    assert [n.op.kind for n in graph.kernel_nodes] == ["conv2d", "matmul"]
    assert all(n.op.dtype == "float32" for n in graph.kernel_nodes)
    assert [i.dtype for i in graph.inputs] == [np.dtype(np.float16)]
    compiled = compile_model(path, store=tmp_path / "store", policy="analytic")
    x = np.random.default_rng(1).standard_normal((1, 8, 4, 4)).astype(np.float16)
    ours = compiled.run({"x": x})["y"]
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    assert ours.dtype == np.float16 and ours.shape == (1, 10)
    np.testing.assert_allclose(ours.astype(np.float32), theirs.astype(np.float32),
                               rtol=2e-3, atol=2e-3 * float(np.abs(theirs).max()))


def test_a_float16_proto_given_in_memory_is_left_as_it_was() -> None:
    model = _fp16_cnn()
    before = model.SerializeToString()
    graph = frontend.load_graph(model)
    assert model.SerializeToString() == before
    assert graph.kernel_nodes[0].op.dtype == "float32"


def test_unreadable_float16_weights_are_one_model_error(tmp_path: Path) -> None:
    model = _fp16_cnn()
    broken = model.graph.initializer[0]
    broken.ClearField("raw_data")
    broken.raw_data = b"\x00\x01\x02"  # three bytes for 16*8*3*3 halves
    path = tmp_path / "broken.onnx"
    onnx.save(model, path)
    with pytest.raises(ModelError, match="cannot read the float16 tensors of model"):
        frontend.load_graph(path)
