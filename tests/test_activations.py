"""Activations onnxruntime has and the exporters write become kernels: Mish fused into a
convolution's epilogue, LeakyRelu/PRelu/Elu/Selu/Softplus/Mish as elementwise chain steps;
each matches onnxruntime, NaN and infinities included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("onnxruntime")

from onnx_support import compile_and_compare

from tunecache.compiler.frontend import load_graph


def _model(nodes: list[onnx.NodeProto], x: list[int], inits: dict[str, np.ndarray],
           opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "act", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def _feeds(x: list[int]) -> dict[str, np.ndarray]:
    values = np.random.default_rng(5).standard_normal(x).astype(np.float32) * 4
    flat = values.reshape(-1)
    flat[:6] = [np.nan, np.inf, -np.inf, 0.0, 30.0, -30.0]
    return {"x": values}


ACTIVATIONS: dict[str, tuple[dict[str, Any], dict[str, np.ndarray], list[str]]] = {
    "leaky": ({}, {}, ["prelu"]),
    "leaky-0.2": ({"alpha": 0.2}, {}, ["prelu"]),
    "prelu-channel": ({}, {"slope": np.linspace(-0.5, 0.5, 6, dtype=np.float32).reshape(
        6, 1, 1)}, ["prelu"]),
    "prelu-scalar": ({}, {"slope": np.array([0.25], np.float32)}, ["prelu"]),
    "elu": ({}, {}, ["elu"]), "elu-0.5": ({"alpha": 0.5}, {}, ["elu"]),
    "selu": ({}, {}, ["elu", "mul"]), "softplus": ({}, {}, ["softplus"]),
    "mish": ({}, {}, ["mish"]),
}
OP_TYPES = {"leaky": "LeakyRelu", "prelu": "PRelu", "elu": "Elu", "selu": "Selu",
            "softplus": "Softplus", "mish": "Mish"}


@pytest.mark.parametrize("case", sorted(ACTIVATIONS))
def test_activation_is_an_elementwise_step_and_matches(case: str, tmp_path: Path) -> None:
    attrs, inits, steps = ACTIVATIONS[case]
    op = OP_TYPES[case.split("-")[0]]
    x = [2, 6, 5, 7]
    nodes = [helper.make_node("Add", ["x", "one"], ["a"]),
             helper.make_node(op, ["a", *inits], ["y"], **attrs)]
    model = _model(nodes, x, {"one": np.ones(1, np.float32), **inits})
    (kernel,) = load_graph(model).kernel_nodes
    assert kernel.op.kind == "elementwise" and list(kernel.op.epilogue) == ["add", *steps]
    compile_and_compare(model, tmp_path, _feeds(x))


@pytest.mark.parametrize("conv_follower", ["Mish", "LeakyRelu"])
def test_after_a_convolution(conv_follower: str, tmp_path: Path) -> None:
    """Mish joins the convolution's epilogue (YOLOv4's); LeakyRelu runs as its own kernel."""
    w = np.random.default_rng(6).standard_normal((8, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(conv_follower, ["c"], ["y"])]
    model = _model(nodes, [1, 4, 9, 9], {"w": w})
    kernels = load_graph(model).kernel_nodes
    if conv_follower == "Mish":
        assert [k.op.kind for k in kernels] == ["conv2d"] and "mish" in kernels[0].op.epilogue
    else:
        assert [k.op.kind for k in kernels] == ["conv2d", "elementwise"]
    compile_and_compare(model, tmp_path)
