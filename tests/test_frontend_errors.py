"""Clear errors: unreadable models, unsupported ops and opsets, dynamic shapes, bad inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx
import onnx_support as models
from onnx import TensorProto, helper

from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.executor import Executor
from tunecache.compiler.frontend import load_graph
from tunecache.compiler.graph import ModelError


def tiny(opset: int = 13, op: str = "Relu", domain: str = "", name: str = "act",
         shape: tuple[int, ...] = (2, 3)) -> onnx.ModelProto:
    b = models.Builder(opset)
    x = b.input("x", list(shape))
    b.nodes.append(helper.make_node(op, [x], ["y"], name=name, domain=domain))
    return b.model(["y"])


def test_model_error_is_a_tunecache_error() -> None:
    assert issubclass(ModelError, TunecacheError)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"does not exist"):
        load_graph(tmp_path / "nope.onnx")
    with pytest.raises(ModelError, match=r"not a file"):
        load_graph(tmp_path)


@pytest.mark.parametrize("content", [b"", b"\x00\x01garbage\xff" * 50, b"not an onnx model"],
                         ids=["empty", "garbage", "text"])
def test_malformed_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelError, match=r"cannot read ONNX model|is not an ONNX model"):
        load_graph(path)


def test_truncated_file(tmp_path: Path) -> None:
    data = models.resnet_model(13).SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match=r"cut\.onnx"):
        load_graph(path)


def test_not_a_model_object() -> None:
    with pytest.raises(ModelError, match=r"path or an onnx.ModelProto, got int"):
        load_graph(42)  # type: ignore[arg-type]


def test_unknown_op_names_node_and_op() -> None:
    with pytest.raises(ModelError, match=r"op types tunecache cannot run: 'GlobalLpPool' "
                                         r"\(node 'act'\)\. It runs the default-domain ops"):
        load_graph(tiny(op="GlobalLpPool", shape=(1, 2, 3, 3)))


def test_unknown_ops_are_all_listed_and_custom_domains_named() -> None:
    model = tiny(op="FusedConv", domain="com.microsoft")
    for i in range(5):
        model.graph.node.append(helper.make_node("MaxRoiPool", ["y", "rois"], [f"z{i}"],
                                                 name=f"roi{i}", pooled_shape=[1, 1]))
    model.graph.input.append(helper.make_tensor_value_info("rois", TensorProto.FLOAT, [1, 5]))
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(ModelError, match=r"'com.microsoft.FusedConv' \(node 'act'\); "
                                         r"'MaxRoiPool' \(nodes 'roi0', 'roi1', 'roi2' and 2 more\)"):
        load_graph(model)


def test_unnamed_node_gets_its_index() -> None:
    with pytest.raises(ModelError, match=r"'GlobalLpPool' \(node 'node0'\)"):
        load_graph(tiny(op="GlobalLpPool", name="", shape=(1, 2, 3, 3)))


def test_old_opset_is_refused() -> None:
    with pytest.raises(ModelError, match=r"opset 6; tunecache reads opset 7 and later"):
        load_graph(tiny(opset=6))


def test_undefined_tensor() -> None:
    b = models.Builder(13)
    b.input("x", [2])
    y = b.node("Relu", ["ghost"], name="r")
    with pytest.raises(ModelError, match=r"node 'r' \(Relu\) uses tensor 'ghost', which is not"):
        load_graph(b.model([y]))


def dynamic_model() -> onnx.ModelProto:
    model = models.mlp_model(13)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    return model


def test_dynamic_input_needs_input_shapes() -> None:
    with pytest.raises(ModelError, match=r"input 'x' has dynamic shape \[\?, 2, 3, 4\] \(dims "
                                         r"batch\); give its shape with input_shapes="):
        load_graph(dynamic_model())
    graph = load_graph(dynamic_model(), {"x": (5, 2, 3, 4)})
    assert graph.inputs[0].shape == (5, 2, 3, 4)
    assert graph.kernel_nodes[0].op.dim("M") == 5


def test_bad_input_shapes() -> None:
    with pytest.raises(ModelError, match=r"input_shapes names 'y', which is not an input of "
                                         r"model 'mlp'; its inputs: x"):
        load_graph(dynamic_model(), {"x": (5, 2, 3, 4), "y": (1,)})
    with pytest.raises(ModelError, match=r"gives input 'x' shape \[5, 2, 3, 5\], but the model "
                                         r"declares \[\?, 2, 3, 4\]"):
        load_graph(dynamic_model(), {"x": (5, 2, 3, 5)})
    with pytest.raises(ModelError, match=r"declares"):
        load_graph(dynamic_model(), {"x": (5, 2, 3)})


def test_missing_external_data(tmp_path: Path) -> None:
    model = models.mlp_model(13)
    path = tmp_path / "mlp.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="mlp.bin",
                    size_threshold=0)
    (tmp_path / "mlp.bin").unlink()
    with pytest.raises(ModelError, match=r"cannot read initializer 'w\d+' \(external data is "
                                         r"read relative to"):
        load_graph(path)
    # a ModelProto whose external data was not loaded
    bare = onnx.load(str(path), load_external_data=False)
    with pytest.raises(ModelError, match=r"pass the model's path"):
        load_graph(bare)


@pytest.fixture(scope="module")
def mlp() -> Executor:
    return Executor(load_graph(models.mlp_model(13)))


def test_input_name_errors(mlp: Executor) -> None:
    x = np.zeros((4, 2, 3, 4), np.float32)
    with pytest.raises(ModelError, match=r"missing 'x'; unknown 'X'; the model's inputs are "
                                         r"'x' float32 \[4, 2, 3, 4\]"):
        mlp.run({"X": x})
    with pytest.raises(ModelError, match=r"unknown 'extra'"):
        mlp.run({"x": x, "extra": x})
    with pytest.raises(ModelError, match=r"takes 1 input\(s\) .*, got 2"):
        mlp.run([x, x])
    with pytest.raises(ModelError, match=r"got 1 \(pass a list or a dict of arrays\)"):
        mlp.run(x)  # type: ignore[arg-type]


def test_input_dtype_and_shape_errors(mlp: Executor) -> None:
    with pytest.raises(ModelError, match=r"input 'x' has dtype float64; the model expects float32 "
                                         r"\(convert with \.astype\(np\.float32\)\)"):
        mlp.run({"x": np.zeros((4, 2, 3, 4))})
    with pytest.raises(ModelError, match=r"input 'x' has shape \[1, 2, 3, 4\]; the model expects "
                                         r"\[4, 2, 3, 4\]"):
        mlp.run({"x": np.zeros((1, 2, 3, 4), np.float32)})
    with pytest.raises(ModelError, match=r"input 'x' must be a numpy array, got list"):
        mlp.run({"x": [[0.0]]})  # type: ignore[dict-item]


def test_kernels_for_unknown_nodes() -> None:
    graph = load_graph(models.mlp_model(13))
    with pytest.raises(ModelError, match=r"kernels given for 'nope', which is not a kernel node "
                                         r"of 'mlp'; its kernel nodes: fc1, fc2, fc3"):
        Executor(graph, {"nope": lambda *a: a[0]})


def test_failing_kernel_and_step_name_the_node() -> None:
    graph = load_graph(models.mlp_model(13))

    def broken(*arrays: np.ndarray) -> np.ndarray:
        raise RuntimeError("boom")

    with pytest.raises(ModelError, match=r"kernel node 'fc2' \(matmul\(M=4,N=12,K=16,.*\) "
                                         r"failed: boom"):
        Executor(graph, {"fc2": broken}).run([np.zeros((4, 2, 3, 4), np.float32)])
    b = models.Builder(13)
    x = b.input("x", [2, 3])
    s = b.input("s", [2], dtype=models.I64)
    y = b.node("Reshape", [x, s], name="reshape_it")
    executor = Executor(load_graph(b.model([y])))
    with pytest.raises(ModelError, match=r"node 'reshape_it' \(Reshape\) failed: ValueError"):
        executor.run({"x": np.zeros((2, 3), np.float32), "s": np.array([4, 4], np.int64)})


def test_a_cast_to_an_unknown_element_type_is_refused_by_node_not_a_crash() -> None:
    b = models.Builder(17)
    x = b.input("x", [2, 3])
    b.nodes.append(helper.make_node("Cast", [x], ["y"], name="to_what", to=99))
    with pytest.raises(ModelError, match=r"node 'to_what' \(Cast\)"):
        load_graph(b.model(["y"]))


def _one_node(node: onnx.NodeProto, inits: dict[str, np.ndarray] | None = None, *,
              outputs: tuple[str, ...] = ("y",), opset: int = 17, ir_version: int = 8,
              inputs: tuple[tuple[str, int, tuple[int, ...]], ...] = (
                  ("x", onnx.TensorProto.FLOAT, (2, 3)),)) -> onnx.ModelProto:
    """A model around ``node`` made without onnx.checker, so that its defect reaches us."""
    graph = helper.make_graph(
        [node], "bad", [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in inputs],
        [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs],
        [onnx.numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=ir_version)


F32 = onnx.TensorProto.FLOAT
# Graphs onnxruntime refuses when it creates the session, which tunecache used to run (or
# to crash on with a numpy error): found by tests/test_fuzz_onnxruntime.py.
REFUSED = {
    "node output named like an initializer": (
        _one_node(helper.make_node("Relu", ["x"], ["w"]), {"w": np.ones((2, 3), np.float32)},
                  outputs=("w",)),
        r"node 'node0' \(Relu\) writes 'w', which is already an initializer"),
    "node output named like the graph input": (
        _one_node(helper.make_node("Relu", ["x"], ["x"]), outputs=("x",)),
        r"writes 'x', which is already a graph input"),
    "input declared twice": (
        _one_node(helper.make_node("Relu", ["x"], ["y"]), inputs=(("x", F32, (2, 3)),) * 2),
        r"graph input 'x' is declared twice"),
    "no outputs": (
        _one_node(helper.make_node("Relu", ["x"], ["y"]), outputs=()),
        r"the graph has no outputs"),
    "output nobody writes": (
        _one_node(helper.make_node("Relu", ["x"], ["y"]), outputs=("y", "nowhere")),
        r"graph output 'nowhere' is not a graph input, an initializer or the output of a node"),
    "opset 99": (
        _one_node(helper.make_node("Relu", ["x"], ["y"]), opset=99),
        r"uses opset 99, which does not exist yet"),
    "IR version 99": (
        _one_node(helper.make_node("Relu", ["x"], ["y"]), ir_version=99),
        r"has IR version 99, which does not exist yet"),
    "Relu with two inputs": (
        _one_node(helper.make_node("Relu", ["x", "x"], ["y"])),
        r"node 'node0' \(Relu\): .*input size 2 not in range"),
    "Concat without axis": (
        _one_node(helper.make_node("Concat", ["x", "x"], ["y"])),
        r"node 'node0' \(Concat\): Required attribute 'axis' is missing"),
    "float32 x float64": (
        _one_node(helper.make_node("MatMul", ["x", "w"], ["y"]), {"w": np.ones((3, 2))}),
        r"node 'node0' \(MatMul\): inputs 'x' and 'w' share type parameter T but are "
        r"tensor\(float\) and tensor\(double\)"),
    "Reshape to [-1, -1]": (
        _one_node(helper.make_node("Reshape", ["x", "s"], ["y"]),
                  {"s": np.array([-1, -1], np.int64)}),
        r"shape inference failed.*multiple -1"),
    "Transpose perm repeats an axis": (
        _one_node(helper.make_node("Transpose", ["x"], ["y"], perm=[0, 0])),
        r"shape inference failed.*repeated value"),
    "Conv weight channels": (
        _one_node(helper.make_node("Conv", ["x", "w"], ["y"]),
                  {"w": np.ones((2, 4, 1, 1), np.float32)}, inputs=(("x", F32, (1, 3, 4, 4)),)),
        r"node 'node0' \(Conv\): the input has 3 channels, but the weight \[2, 4, 1, 1\] with "
        r"group 1 takes 4"),
    "Conv kernel_shape": (
        _one_node(helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1]),
                  {"w": np.ones((2, 3, 3, 3), np.float32)}, inputs=(("x", F32, (1, 3, 4, 4)),)),
        r"kernel_shape \[1, 1\] differs from the weight's \[3, 3\]"),
    "Conv group": (
        _one_node(helper.make_node("Conv", ["x", "w"], ["y"], group=3),
                  {"w": np.ones((2, 1, 1, 1), np.float32)}, inputs=(("x", F32, (1, 3, 4, 4)),)),
        r"group 3 does not divide the weight's 2 output channels"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_graphs_onnxruntime_refuses_are_refused_at_load(case: str) -> None:
    model, message = REFUSED[case]
    with pytest.raises(ModelError, match=message):
        load_graph(model)


def test_two_nodes_writing_one_tensor_are_refused() -> None:
    model = _one_node(helper.make_node("Relu", ["x"], ["y"], name="a"))
    model.graph.node.append(helper.make_node("Sigmoid", ["x"], ["y"], name="b"))
    with pytest.raises(ModelError, match=r"node 'b' \(Sigmoid\) writes 'y', which is already "
                                         r"written by node 'a'"):
        load_graph(model)
