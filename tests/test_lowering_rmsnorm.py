"""RMSNorm written as primitive ONNX nodes (Pow, ReduceMean, Add, Sqrt, Div or Reciprocal,
Mul, Cast) becomes one ``layernorm`` kernel with ``norm=rms``: in hand-built graphs of the
TorchScript and dynamo forms, in the Llama exporter fixtures, and not when the chain is only
nearly RMSNorm (those nodes then run in numpy, still correctly)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

from onnx_support import F32, Builder, assert_close, compile_and_compare, ort_run, random_feeds
from test_frontend_exporters import DATA, exporter_feeds

from tunecache.cache.store import Store
from tunecache.compiler.frontend import load_graph
from tunecache.compiler.graph import Graph, KernelNode
from tunecache.tuner.deploy import compile_model

SHAPE = (2, 5, 16)
EPS = 1e-6


def rms_kernels(graph: Graph) -> list[KernelNode]:
    return [k for k in graph.kernel_nodes
            if k.op.kind == "layernorm" and k.op.attr("norm") == "rms"]


def numpy_ops(graph: Graph) -> list[str]:
    return [n.op_type for n in graph.onnx_nodes]


def rms_model(form: str) -> onnx.ModelProto:
    """``x = a + b`` (a residual stream: also read after the norm), normalised as the
    exporters write RMSNorm, then added back to ``x``.

    ``torchscript``: opset 17, Cast, ``Div(1, Sqrt)``, ``Mul(x, .)``, Cast, ``Mul(., w)``;
    ``dynamo``: opset 18 (axes as an input), ``Add(eps, .)``, Reciprocal, ``Mul(., x)``,
    ``Mul(w, .)``; ``div``: ``Div(x, Sqrt)`` and no weight; ``centred``: LayerNorm written
    out (opset 13), the norm of ``x - mean x`` by ``Div`` then scaled and shifted."""
    b = Builder({"torchscript": 17, "centred": 13}.get(form, 18), seed=3)
    x = b.node("Add", [b.input("a", SHAPE), b.input("b", SHAPE)], name="residual")
    if form == "torchscript":
        x = b.node("Cast", [x], to=F32)
    residual = x
    if form == "centred":
        x = b.node("Sub", [x, b.reduce_mean(x, [-1])])
    power = b.node("Pow", [x, b.const(np.float32(2.0))], name="pow")
    mean = b.reduce_mean(power, [-1])
    eps = b.const(np.float32(EPS))
    shifted = b.node("Add", [mean, eps] if form != "dynamo" else [eps, mean])
    root = b.node("Sqrt", [shifted])
    weight = b.weight(SHAPE[-1], scale=1.0)
    if form == "torchscript":
        inverse = b.node("Div", [b.const(np.float32(1.0)), root])
        y = b.node("Cast", [b.node("Mul", [x, inverse])], to=F32)
        y = b.node("Mul", [y, weight])
    elif form == "dynamo":
        y = b.node("Mul", [b.node("Reciprocal", [root]), x])
        y = b.node("Mul", [weight, y])
    else:
        y = b.node("Div", [x, root])
    if form == "centred":
        y = b.node("Mul", [y, weight])
        y = b.node("Add", [b.weight(SHAPE[-1], scale=0.1), y])
    return b.model([b.node("Add", [residual, y], name="out")])


@pytest.mark.parametrize("form", ["torchscript", "dynamo", "div", "centred"])
def test_rmsnorm_chain_is_one_rms_kernel(form: str, tmp_path: Path) -> None:
    graph = load_graph(rms_model(form))
    (kernel,) = rms_kernels(graph)
    assert kernel.op.dim("M") == SHAPE[0] * SHAPE[1] and kernel.op.dim("N") == SHAPE[-1]
    affine = {"div": "none", "centred": "gamma_beta"}.get(form, "gamma")
    assert kernel.op.attr("affine") == affine
    assert kernel.op.attr("residual") == "no"
    assert kernel.nodes[0] == "pow" and "residual" not in kernel.nodes
    assert len(kernel.inputs) == {"none": 2, "gamma": 3, "gamma_beta": 4}[affine]
    assert graph.constants[kernel.inputs[-1]].tolist() == [np.float32(EPS)]
    # Only the mean a centred x needs remains in numpy: the no-op Cast producing x (float32
    # to float32) is elided at load time, like an Identity.
    assert numpy_ops(graph) == {"centred": ["ReduceMean"]}.get(form, [])
    compiled = compile_and_compare(rms_model(form), tmp_path)
    assert [e.op.text for e in compiled.plan if e.op.kind == "layernorm"] == [kernel.op.text]


def near_miss(kind: str) -> onnx.ModelProto:
    """RMSNorm but for one detail: eps a graph input, the mean over a middle axis, or the
    mean also a graph output."""
    b = Builder(17, seed=4)
    x = b.input("x", SHAPE)
    mean = b.reduce_mean(b.node("Pow", [x, b.const(np.float32(2.0))]), [1 if kind == "axis" else -1])
    eps = b.input("eps", [1]) if kind == "eps" else b.const(np.float32(EPS))
    root = b.node("Sqrt", [b.node("Add", [mean, eps])])
    y = b.node("Mul", [x, b.node("Reciprocal", [root])])
    y = b.node("Mul", [y, b.weight(SHAPE[-1], scale=1.0)])
    outputs = [y, mean] if kind == "shared" else [y]
    return b.model(outputs)


@pytest.mark.parametrize("kind", ["eps", "axis", "shared"])
def test_near_miss_stays_in_numpy_and_runs(kind: str, tmp_path: Path) -> None:
    model = near_miss(kind)
    graph = load_graph(model)
    assert not rms_kernels(graph)
    assert {"Pow", "ReduceMean"} <= set(numpy_ops(graph))
    feeds = random_feeds(model)
    if kind == "eps":  # a positive epsilon keeps the reference finite
        feeds["eps"] = np.array([EPS], np.float32)
    compile_and_compare(model, tmp_path, feeds)


@pytest.mark.parametrize("name", ["llama_torchscript17", "llama_dynamo18"])
def test_llama_norms_are_rms_kernels(name: str, tmp_path: Path) -> None:
    path = DATA / f"{name}.onnx"
    model = onnx.load(str(path))
    blocks = sum(n.op_type == "Pow" for n in model.graph.node)
    assert blocks == 5  # two layers of two norms each, and the final norm
    shapes = {"input_ids": (1, 4), "attention_mask": (1, 4)}
    graph = load_graph(path, shapes)
    assert len(rms_kernels(graph)) == blocks
    assert not {"Pow", "ReduceMean", "Sqrt", "Reciprocal"} & set(numpy_ops(graph))
    compiled = compile_model(path, store=Store(tmp_path), policy="analytic",
                             input_shapes=shapes)
    rms = [e for e in compiled.plan if e.op.kind == "layernorm" and e.op.attr("norm") == "rms"]
    assert len(rms) == blocks and all(e.node in compiled.kernels for e in rms)
    assert compiled.info is not None
    for batch, seq in ((1, 4), (2, 3)):
        feeds = exporter_feeds(compiled.info, batch, seq, seed=batch + seq)
        assert_close(compiled.run(feeds), ort_run(model, feeds), ["logits"])


@pytest.mark.parametrize(("axis", "kernel"), [(-1, True), (2, True), (1, False)])
def test_opset_23_rmsnormalization_node_is_one_rms_kernel(axis: int, kernel: bool,
                                                          tmp_path: Path) -> None:
    """The RMSNormalization node over the last axis is the rms kernel; over more axes it
    runs outside kernels, and either way matches ONNX's reference implementation."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    scale_shape = [16] if axis in (-1, 2) else [8, 16]
    scale = np.random.default_rng(1).uniform(0.5, 1.5, scale_shape).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=axis, epsilon=1e-6)],
        "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(scale, "scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)],
                              ir_version=10)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert len(rms_kernels(load_graph(path))) == (1 if kernel else 0)
    x = np.random.default_rng(2).standard_normal((2, 8, 16)).astype(np.float32)
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic")
    [expected] = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=1e-5, atol=1e-5)
