"""Ops run by ONNX's reference implementation: correct against onnxruntime, and said.

The standard ops with no numpy code in tunecache (TopK, LpNormalization, …), the types numpy lacks
(bfloat16, float8), and the node forms the numpy code leaves to the reference (a MaxPool's
indices) run through ``onnx.reference``; ``compile --json`` names each such node and
``run --profile`` times it as ``reference``. What nothing runs is refused naming every op.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

pytest.importorskip("onnxruntime")

from onnx_support import ort_run

from tunecache.cache.store import Store
from tunecache.compiler.graph import ModelError
from tunecache.compiler.onnx_ops import engine
from tunecache.tuner.deploy import compile_model


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: dict[str, int], inits: dict[str, np.ndarray], opset: int = 19
           ) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "ref", inputs,
                              [helper.make_tensor_value_info(o, t, None)
                               for o, t in outputs.items()],
                              [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=9)


def _reference_model() -> onnx.ModelProto:
    """A conv (a generated kernel), an LpNormalization and a TopK (reference), a MaxPool
    with its indices (left to the reference by the numpy code)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("LpNormalization", ["c"], ["r"], axis=-1, name="lpnorm"),
             helper.make_node("TopK", ["r", "k"], ["v", "i"], axis=-1, name="topk"),
             helper.make_node("MaxPool", ["c"], ["p", "pi"], kernel_shape=[2, 2],
                              strides=[2, 2], name="pool")]
    inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
             "k": np.array([5], np.int64)}
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                  {"v": TensorProto.FLOAT, "i": TensorProto.INT64, "p": TensorProto.FLOAT,
                   "pi": TensorProto.INT64}, inits)


def test_reference_ops_match_onnxruntime_beside_kernels(tmp_path: Path) -> None:
    model = _reference_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic")
    assert [n.op.kind for n in compiled.graph.kernel_nodes] == ["conv2d"]
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    ours, theirs = compiled.run({"x": x}), ort_run(model, {"x": x})
    for name, want in zip(("v", "i", "p", "pi"), theirs, strict=True):
        assert ours[name].dtype == want.dtype and ours[name].shape == want.shape
        np.testing.assert_allclose(ours[name], want, rtol=1e-5, atol=1e-5)
    outside = {n["op"]: n["engine"] for n in compiled.summary()["outside_kernels"]}
    assert outside == {"LpNormalization": "reference", "TopK": "reference", "MaxPool": "reference"}
    profile = compiled.profile({"x": x}, runs=2)
    assert {t.step.op: t.step.where for t in profile.steps if t.step.where == "reference"} == {
        "LpNormalization": "reference", "TopK": "reference", "MaxPool": "reference"}


def test_bfloat16_and_float8_casts_round_as_onnx_defines(tmp_path: Path) -> None:
    nodes = [helper.make_node("Cast", ["x"], ["b"], to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["b"], ["y"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["x"], ["f8"], to=TensorProto.FLOAT8E4M3FN),
             helper.make_node("Cast", ["f8"], ["z"], to=TensorProto.FLOAT)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
                   {"y": TensorProto.FLOAT, "z": TensorProto.FLOAT}, {})
    x = np.linspace(-600, 600, 64, dtype=np.float32)
    compiled = compile_model(_saved(model, tmp_path),
                             store=Store(tmp_path / "s"), policy="analytic")
    ours = compiled.run({"x": x})
    theirs = ort_run(model, {"x": x})
    np.testing.assert_array_equal(ours["y"], theirs[0])
    np.testing.assert_array_equal(ours["z"], theirs[1])  # float8 saturates at 448
    assert np.abs(ours["z"]).max() == 448


def _saved(model: onnx.ModelProto, folder: Path) -> Path:
    path = folder / "m.onnx"
    onnx.save(model, str(path))
    return path


def test_empty_reductions_are_the_identity_of_their_op() -> None:
    from tunecache.compiler.onnx_ops import OPS

    x = np.zeros((2, 0, 3), np.float32)
    axes = np.array([1], np.int64)
    [high] = OPS["ReduceMax"]([x, axes], {"keepdims": 0}, 18)
    [low] = OPS["ReduceMin"]([x.astype(np.int32), axes], {"keepdims": 0}, 18)
    assert high.shape == (2, 3) and (high == -np.inf).all()
    assert low.dtype == np.int32 and (low == np.iinfo(np.int32).max).all()


def test_training_dropout_through_its_input_is_refused(tmp_path: Path) -> None:
    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["y"], name="drop")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
              helper.make_tensor_value_info("train", TensorProto.BOOL, [])]
    model = _model(nodes, inputs, {"y": TensorProto.FLOAT},
                   {"ratio": np.array(0.5, np.float32)})
    with pytest.raises(ModelError, match=r"node 'drop' \(Dropout\): training mode .* not a "
                                         "constant"):
        compile_model(_saved(model, tmp_path), store=Store(tmp_path / "s"), policy="analytic")
    constant = _model(nodes, inputs[:1], {"y": TensorProto.FLOAT},
                      {"ratio": np.array(0.5, np.float32), "train": np.array(True)})
    with pytest.raises(ModelError, match=r"training_mode input is true"):
        compile_model(_saved(constant, tmp_path), store=Store(tmp_path / "s"), policy="analytic")


def test_engine_says_what_runs_a_node() -> None:
    assert engine("Relu", 17) == "numpy"
    assert engine("LpNormalization", 19) == "reference"
    assert engine("Resize", 19) == "numpy"
    assert engine("Cast", 19, {"to": TensorProto.BFLOAT16}) == "reference"
    assert engine("Cast", 19, {"to": TensorProto.FLOAT}) == "numpy"
    assert engine("MaxPool", 17, {}, ("y", "indices")) == "reference"
    assert engine("Loop", 17) == "reference"  # its subgraph's outer reads are inputs
    assert engine("SequenceAt", 17) is None  # not a tensor op


def test_compile_json_and_text_name_the_nodes_outside_kernels(tmp_path: Path) -> None:
    path = _saved(_reference_model(), tmp_path)
    command = [sys.executable, "-m", "tunecache.tuner.cli", "compile", str(path),
               "--root", str(tmp_path / "s"), "--policy", "analytic"]
    report = json.loads(subprocess.run([*command, "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    assert {(n["node"], n["engine"]) for n in report["outside_kernels"]} == {
        ("lpnorm", "reference"), ("topk", "reference"), ("pool", "reference")}
    text = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert "outside kernels, ONNX's reference implementation (slow): LpNormalization, " \
        "MaxPool, TopK" in text


def _branch(name: str, nodes: list[onnx.NodeProto], out: str) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [],
                             [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])


def test_an_if_on_a_constant_is_its_branch_and_one_on_data_reads_the_outer_scope(
        tmp_path: Path) -> None:
    """The first If's condition folds: its then-branch (a MatMul of the outer x and w) joins
    the graph and becomes a kernel. The second If's condition is data: it runs in the
    reference, its branches reading x and the first If's output from the outer graph."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    then1 = _branch("then1", [helper.make_node("MatMul", ["x", "w"], ["t1"])], "t1")
    else1 = _branch("else1", [helper.make_node("Neg", ["x"], ["e1"])], "e1")
    then2 = _branch("then2", [helper.make_node("Add", ["x", "y1"], ["t2"])], "t2")
    else2 = _branch("else2", [helper.make_node("Sub", ["x", "y1"], ["e2"])], "e2")
    nodes = [helper.make_node("If", ["yes"], ["y1"], then_branch=then1, else_branch=else1,
                              name="fixed"),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["positive"]),
             helper.make_node("If", ["positive"], ["y"], then_branch=then2,
                              else_branch=else2, name="chosen")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                   {"y": TensorProto.FLOAT},
                   {"w": w, "yes": np.array(True), "zero": np.array(0, np.float32)})
    path = _saved(model, tmp_path)
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic")
    assert [k.op.kind for k in compiled.graph.kernel_nodes] == ["matmul"]
    assert [s.op_type for s in compiled.graph.onnx_nodes if s.op_type == "If"] == ["If"]
    for sign in (1.0, -1.0):
        x = np.abs(rng.standard_normal((4, 8))).astype(np.float32) * sign
        np.testing.assert_allclose(compiled.run({"x": x})["y"], ort_run(model, {"x": x})[0],
                                   rtol=1e-5, atol=1e-5)


def test_a_loop_reads_the_outer_scope_and_stacks_scalar_scans(tmp_path: Path) -> None:
    """Loop's body adds the outer ``step`` to its carried value and scans the running sum
    of it, a scalar per iteration: the scan output is [iterations], as onnxruntime gives
    (onnx.reference's own Loop would give [iterations, 1])."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
         helper.make_node("ReduceSum", ["acc_out"], ["scan"], keepdims=0)],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [])])
    nodes = [helper.make_node("Loop", ["trips", "go", "x"], ["acc", "sums"], body=body)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                           helper.make_tensor_value_info("step", TensorProto.FLOAT, [3])],
                   {"acc": TensorProto.FLOAT, "sums": TensorProto.FLOAT},
                   {"trips": np.array(5, np.int64), "go": np.array(True)}, opset=17)
    compiled = compile_model(_saved(model, tmp_path), store=Store(tmp_path / "s"),
                             policy="analytic")
    feeds = {"x": np.arange(3, dtype=np.float32), "step": np.ones(3, np.float32)}
    ours, theirs = compiled.run(feeds), ort_run(model, feeds)
    assert ours["sums"].shape == theirs[1].shape == (5,)
    np.testing.assert_allclose(ours["acc"], theirs[0])
    np.testing.assert_allclose(ours["sums"], theirs[1])


def test_run_compare_says_when_onnxruntime_refuses_a_model(tmp_path: Path) -> None:
    """Softsign in float64, which this onnxruntime has no kernel for: ours runs it and the
    comparison says, in one line, that onnxruntime refused the model and why."""
    import onnxruntime as ort

    model = _model([helper.make_node("Softsign", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 3])],
                   {"y": TensorProto.DOUBLE}, {}, opset=21)
    path = _saved(model, tmp_path)
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        pytest.skip("this onnxruntime runs float64 Softsign")
    except Exception:
        pass
    command = [sys.executable, "-m", "tunecache.tuner.cli", "run", str(path), "--root",
               str(tmp_path / "s"), "--compare", "onnxruntime", "--repeat", "2"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    [line] = [x for x in done.stdout.splitlines() if "onnxruntime" in x]
    assert line.startswith("onnxruntime refused the model: ") and "Softsign" in line
    report = json.loads(subprocess.run([*command, "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    assert "Softsign" in report["onnxruntime"]["refused"] and "latency_ratio" not in report


def test_an_if_on_a_constant_whose_branch_has_subgraphs_stays_an_if(tmp_path: Path) -> None:
    """Inlining renames the branch's names, which a subgraph inside it would still read by
    their old names: such a branch is not inlined, and the If runs in the reference."""
    inner = helper.make_node("If", ["yes"], ["t"], then_branch=_branch(
        "a", [helper.make_node("Relu", ["x"], ["r"])], "r"), else_branch=_branch(
        "b", [helper.make_node("Neg", ["x"], ["n"])], "n"))
    outer = helper.make_node("If", ["yes"], ["y"], name="outer",
                             then_branch=_branch("then", [inner], "t"),
                             else_branch=_branch("else", [helper.make_node(
                                 "Identity", ["x"], ["e"])], "e"))
    model = _model([outer], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                   {"y": TensorProto.FLOAT}, {"yes": np.array(True)})
    compiled = compile_model(_saved(model, tmp_path), store=Store(tmp_path / "s"),
                             policy="analytic")
    assert [(s.name, s.op_type) for s in compiled.graph.onnx_nodes] == [("outer", "If")]
    x = np.random.default_rng(6).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], ort_run(model, {"x": x})[0])
