"""An inference ``BatchNormalization`` that no conv folds (DenseNet's pre-activation BN-ReLU
after a concatenation, a lone BN) becomes one ``elementwise`` kernel ``mul+add`` with
per-channel operands, a following ``Relu`` or ``Clip(0, 6)`` fused in; compiled and run
against onnxruntime. Nodes the lowering does not take still run in numpy, correctly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

from onnx_support import Builder, compile_and_compare, ort_run, random_feeds

from tunecache.compiler.executor import Executor
from tunecache.compiler.frontend import load_graph
from tunecache.compiler.graph import Graph, KernelNode, ModelError
from tunecache.compiler.lowering.batchnorm import folded_parameters

EPS = 1e-3


def bn_params(b: Builder, channels: int) -> list[str]:
    r = b.rng
    return [b.const((1 + 0.3 * r.standard_normal(channels)).astype(np.float32), "gamma"),
            b.const((0.2 * r.standard_normal(channels)).astype(np.float32), "beta"),
            b.const((0.2 * r.standard_normal(channels)).astype(np.float32), "mean"),
            b.const((0.5 + r.random(channels)).astype(np.float32), "var")]


def params_of(model: onnx.ModelProto, bn: str) -> list[np.ndarray]:
    node = next(n for n in model.graph.node if n.name == bn)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    return [inits[t] for t in node.input[1:5]]


def dense_model(opset: int, batch: int, tail: str = "relu") -> onnx.ModelProto:
    """Concat of two feature maps -> BN -> Relu (or Clip(0, 6)) -> 1x1 Conv: a DenseNet
    layer's input, where the BN follows no conv."""
    b = Builder(opset, seed=11)
    a = b.input("a", [batch, 3, 6, 5])
    c = b.input("c", [batch, 5, 6, 5])
    x = b.node("Concat", [a, c], axis=1, name="concat")
    y = b.node("BatchNormalization", [x, *bn_params(b, 8)], name="bn", epsilon=EPS)
    y = b.node("Relu", [y], name="act") if tail == "relu" else b.clip(y, 0.0, 6.0)
    return b.model([b.conv(y, 8, 4, 1, pad=0, name="conv")], "dense_layer")


def lone_model(opset: int, shape: tuple[int, ...]) -> onnx.ModelProto:
    """A BatchNormalization of a graph input, its output the graph's."""
    b = Builder(opset, seed=12)
    x = b.input("x", list(shape))
    y = b.node("BatchNormalization", [x, *bn_params(b, shape[1])], name="bn", epsilon=EPS)
    return b.model([y], "lone_bn")


def elementwise_kernels(graph: Graph) -> list[KernelNode]:
    return [k for k in graph.kernel_nodes if k.op.kind == "elementwise"]


def numpy_ops(graph: Graph) -> list[str]:
    return [n.op_type for n in graph.onnx_nodes]


@pytest.mark.parametrize(("opset", "batch"), [(9, 1), (15, 2)])
def test_bn_relu_after_concat_is_one_kernel(opset: int, batch: int, tmp_path: Path) -> None:
    model = dense_model(opset, batch)
    graph = load_graph(model)
    (kernel,) = elementwise_kernels(graph)
    assert kernel.nodes == ("bn", "act")
    assert kernel.op.text == (f"elementwise(M={batch * 8},N=30,dtype=float32,operand=col,"
                              "epilogue=mul+add+relu)")
    scale, shift = folded_parameters(params_of(model, "bn"), EPS)
    # one value per row: the channel vectors repeated for every batch item
    np.testing.assert_array_equal(graph.constants[kernel.inputs[1]], np.tile(scale, batch))
    np.testing.assert_array_equal(graph.constants[kernel.inputs[2]], np.tile(shift, batch))
    assert "BatchNormalization" not in numpy_ops(graph)
    compiled = compile_and_compare(model, tmp_path)
    assert {k.name for k in compiled.graph.kernel_nodes} == {"bn", "conv"}


@pytest.mark.parametrize("opset", [9, 15])
def test_bn_clip6_is_one_kernel(opset: int, tmp_path: Path) -> None:
    model = dense_model(opset, 2, tail="clip6")
    (kernel,) = elementwise_kernels(load_graph(model))
    assert kernel.op.epilogue == ("mul", "add", "clip6") and len(kernel.nodes) == 2
    compile_and_compare(model, tmp_path)


@pytest.mark.parametrize(("opset", "shape", "operand"), [
    (9, (1, 6, 5, 7), "col"), (15, (2, 6, 5, 7), "col"), (15, (2, 6, 9), "col"),
    (9, (3, 6), "row")])
def test_lone_bn_is_one_mul_add_kernel(opset: int, shape: tuple[int, ...], operand: str,
                                       tmp_path: Path) -> None:
    model = lone_model(opset, shape)
    graph = load_graph(model)
    (kernel,) = graph.kernel_nodes
    assert kernel.nodes == ("bn",) and kernel.op.epilogue == ("mul", "add")
    rows = shape[0] if operand == "row" else shape[0] * shape[1]
    assert kernel.op.attr("operand") == operand
    assert (kernel.op.dim("M"), kernel.op.dim("N")) == (rows, int(np.prod(shape)) // rows)
    assert numpy_ops(graph) == []
    compile_and_compare(model, tmp_path)


def test_bn_output_read_twice_keeps_its_relu_separate(tmp_path: Path) -> None:
    b = Builder(13, seed=13)
    x = b.input("x", [2, 4, 3, 3])
    y = b.node("BatchNormalization", [x, *bn_params(b, 4)], name="bn", epsilon=EPS)
    model = b.model([b.node("Relu", [y], name="act"), b.node("Sigmoid", [y], name="sig")])
    graph = load_graph(model)
    kernels = {k.name: k for k in elementwise_kernels(graph)}
    assert kernels["bn"].nodes == ("bn",) and kernels["bn"].op.epilogue == ("mul", "add")
    assert kernels["act"].op.epilogue == ("relu",)
    compile_and_compare(model, tmp_path)


def test_bn_after_conv_is_still_folded_into_the_conv() -> None:
    b = Builder(13, seed=14)
    x = b.input("x", [2, 3, 6, 6])
    y = b.node("BatchNormalization", [b.conv(x, 3, 4, 3, name="conv"), *bn_params(b, 4)],
               name="bn", epsilon=EPS)
    graph = load_graph(b.model([b.node("Relu", [y], name="act")]))
    (kernel,) = graph.kernel_nodes
    assert kernel.op.kind == "conv2d" and kernel.nodes == ("conv", "bn", "act")


def test_bn_with_runtime_statistics_runs_in_numpy() -> None:
    b = Builder(15, seed=15)
    x = b.input("x", [2, 4, 3, 3])
    mean = b.input("mean", [4])
    gamma, beta, _, var = bn_params(b, 4)
    y = b.node("BatchNormalization", [x, gamma, beta, mean, var], name="bn", epsilon=EPS)
    model = b.model([b.node("Relu", [y], name="act")])
    graph = load_graph(model)
    assert numpy_ops(graph) == ["BatchNormalization"]
    feeds = random_feeds(model)
    got = Executor(graph).run(feeds)
    np.testing.assert_allclose(got[model.graph.output[0].name], ort_run(model, feeds)[0],
                               rtol=1e-5, atol=1e-5)


def test_training_mode_bn_is_refused() -> None:
    b = Builder(15, seed=16)
    x = b.input("x", [2, 4, 3, 3])
    y = b.node("BatchNormalization", [x, *bn_params(b, 4)], name="bn", training_mode=1)
    with pytest.raises(ModelError, match="training mode is not supported"):
        load_graph(b.model([y]))


def test_importing_a_lowering_module_first_keeps_the_builtin_order() -> None:
    """The batchnorm lowering imports the element-wise one; imported before the registry
    loads (as collecting this file does), their lowerings must still be tried in
    BUILTIN_LOWERINGS order, or an element-wise chain claims the residual Add of a
    LayerNorm and the rotary embedding's Mul (a fresh interpreter: the order is global)."""
    import json
    import subprocess
    import sys

    from tunecache.compiler.lowering import BUILTIN_LOWERINGS

    code = ("import json, tunecache.compiler.lowering.batchnorm\n"
            "from tunecache.compiler.lowering import lowerings_for\n"
            "print(json.dumps({t: [f.__module__.rsplit('.', 1)[1] for f in lowerings_for(t)]"
            " for t in ('Add', 'Mul')}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    order = json.loads(out.stdout)
    assert order["Add"].index("rowwise") < order["Add"].index("elementwise")
    assert order["Mul"].index("rotary") < order["Mul"].index("elementwise")
    for modules in order.values():
        assert modules == sorted(modules, key=BUILTIN_LOWERINGS.index)
