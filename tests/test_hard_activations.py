"""HardSwish and torch's HardSigmoid (MobileNet-v3) as epilogue steps, not numpy nodes.

A Conv followed by either fuses it into the conv2d kernel's epilogue; a chain of
element-wise nodes takes them as steps; a HardSigmoid with other than torch's slope (ONNX's
default 0.2) is not torch's step and runs on its own. Every form matches onnxruntime, NaN
included.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

pytest.importorskip("onnxruntime")

from onnx_support import ort_run

from tunecache.cache.store import Store
from tunecache.compiler.frontend import load_graph
from tunecache.tuner.deploy import compile_model


def _model(follower: onnx.NodeProto, after_conv: bool) -> onnx.ModelProto:
    """x -> Conv -> follower, or (a chain) x -> Add(0.25) -> follower."""
    rng = np.random.default_rng(3)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
                                          "w"), onnx.numpy_helper.from_array(
        np.array(0.25, np.float32), "quarter")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv")
             if after_conv else helper.make_node("Add", ["x", "quarter"], ["c"], name="add")]
    follower.input[0] = "c"
    nodes.append(follower)
    graph = helper.make_graph(
        nodes, "hard", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("after_conv", [True, False], ids=["conv-epilogue", "chain"])
@pytest.mark.parametrize(("node", "step"), [
    (helper.make_node("HardSwish", ["?"], ["y"]), "hardswish"),
    (helper.make_node("HardSigmoid", ["?"], ["y"], alpha=1 / 6, beta=0.5), "hardsigmoid"),
    (helper.make_node("HardSigmoid", ["?"], ["y"]), None),  # ONNX's default slope, 0.2
], ids=["hardswish", "hardsigmoid-torch", "hardsigmoid-0.2"])
def test_hard_activations_fuse_and_match_onnxruntime(node: onnx.NodeProto, step: str | None,
                                                     after_conv: bool, tmp_path: Path) -> None:
    model = _model(node, after_conv)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    graph = load_graph(path)
    steps = [s for k in graph.kernel_nodes for s in k.op.epilogue]
    if step is None:
        assert [n.op_type for n in graph.onnx_nodes] == ["HardSigmoid"]
    else:
        assert step in steps and not graph.onnx_nodes
        owner = next(k for k in graph.kernel_nodes if step in k.op.epilogue)
        assert owner.op.kind == ("conv2d" if after_conv else "elementwise")
    x = np.random.default_rng(4).standard_normal((1, 4, 9, 9)).astype(np.float32) * 4
    x[0, 0, 4, 4] = np.nan
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic")
    ours, [theirs] = compiled.run({"x": x})["y"], ort_run(model, {"x": x})
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
