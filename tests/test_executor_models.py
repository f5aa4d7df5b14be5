"""Whole models through the Executor — numpy kernels and generated kernels — against
onnxruntime (float32, rtol = atol = 1e-4)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.matmul import matmul_op

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnx_support as models  # noqa: E402

from tunecache.compiler.executor import Executor, Kernel, numpy_kernel  # noqa: E402
from tunecache.compiler.frontend import load_graph  # noqa: E402
from tunecache.compiler.graph import Graph  # noqa: E402
from tunecache.compiler.ops import OpSignature  # noqa: E402

MODELS: dict[str, Callable[[], Any]] = {
    "resnet-opset8": lambda: models.resnet_model(8),
    "resnet-opset9": lambda: models.resnet_model(9),
    "resnet-opset13-batch2": lambda: models.resnet_model(13, batch=2),
    "mobilenet-opset9": lambda: models.mobilenet_model(9),
    "mobilenet-opset13": lambda: models.mobilenet_model(13),
    "bert-opset17-layernorm": lambda: models.bert_layer_model(17, layer_norm_op=True),
    "bert-opset11-decomposed": lambda: models.bert_layer_model(11, layer_norm_op=False),
    "bert-opset13-decomposed": lambda: models.bert_layer_model(13, layer_norm_op=False),
    "bert-opset18-decomposed": lambda: models.bert_layer_model(18, layer_norm_op=False),
    "mlp-opset7": lambda: models.mlp_model(7),
    "mlp-opset9": lambda: models.mlp_model(9),
    "mlp-opset13": lambda: models.mlp_model(13),
    "fusion-cases": lambda: models.fusion_cases_model(13),
}


def feeds_for(model: Any) -> dict[str, np.ndarray]:
    feeds = models.random_feeds(model)
    if "mask" in feeds:  # an additive attention mask: 0 or -10000
        feeds["mask"] = np.where(feeds["mask"] > 1.0, -10000.0, 0.0).astype(np.float32)
    return feeds


@pytest.fixture(scope="session")
def kernel_for(hw: Any) -> Callable[[OpSignature], Kernel]:
    """Generated kernels with the default schedule, built once per op for the session."""
    from tunecache.compiler.runtime import compile_kernel
    from tunecache.compiler.schedule import default_schedule

    built: dict[OpSignature, Kernel] = {}

    def get(op: OpSignature) -> Kernel:
        if op not in built:
            built[op] = compile_kernel(op, default_schedule(op, hw), hw)
        return built[op]
    return get


def generated_kernels(graph: Graph, kernel_for: Callable[[OpSignature], Kernel]
                      ) -> dict[str, Kernel]:
    return {node.name: kernel_for(node.op) for node in graph.kernel_nodes}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("kernels", ["numpy", "generated"])
def test_model_matches_onnxruntime(name: str, kernels: str,
                                   kernel_for: Callable[[OpSignature], Kernel]) -> None:
    model = MODELS[name]()
    graph = load_graph(model)
    assert graph.kernel_nodes, "every test model has kernel nodes"
    feeds = feeds_for(model)
    expected = models.ort_run(model, feeds)
    chosen = generated_kernels(graph, kernel_for) if kernels == "generated" else None
    executor = Executor(graph, chosen)
    got = executor.run(feeds)
    models.assert_close(got, expected, [o.name for o in graph.outputs])
    # Running again (sequence form, same executor) gives the same result.
    again = executor.run([feeds[i.name] for i in graph.inputs])
    for key in got:
        np.testing.assert_array_equal(again[key], got[key])


def test_external_data_model(tmp_path: Path, kernel_for: Callable[[OpSignature], Kernel]) -> None:
    model = models.resnet_model(13)
    feeds = feeds_for(model)
    expected = models.ort_run(model, feeds)
    path = tmp_path / "nested" / "resnet.onnx"
    path.parent.mkdir()
    # (save_model moves the weights out of `model` itself too)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="resnet.weights", size_threshold=0)
    assert (path.parent / "resnet.weights").stat().st_size > 10_000
    assert path.stat().st_size < 10_000  # the weights really are outside the model file
    graph = load_graph(path)  # a path: external data is read relative to its folder
    assert graph.name == "tiny_resnet"
    got = Executor(graph, generated_kernels(graph, kernel_for)).run(feeds)
    models.assert_close(got, expected, [o.name for o in graph.outputs])


def test_dynamic_batch_with_input_shapes(kernel_for: Callable[[OpSignature], Kernel]) -> None:
    model = models.bert_layer_model(17)
    for vi in model.graph.input:
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    fixed = models.bert_layer_model(17, batch=3)
    graph = load_graph(model, {"hidden": [3, 8, 32], "mask": [3, 1, 1, 8]})
    assert graph.inputs[0].shape == (3, 8, 32)
    texts = {n.name: n.op.text for n in graph.kernel_nodes}
    assert texts["query"].startswith("matmul(M=24,N=32,K=32,")
    assert texts["scores"].startswith("attention(B=12,M=8,N=8,D=8,Dv=0,mask_rows=3,")
    feeds = feeds_for(fixed)
    got = Executor(graph, generated_kernels(graph, kernel_for)).run(feeds)
    models.assert_close(got, models.ort_run(fixed, feeds), [o.name for o in graph.outputs])


def test_numpy_kernel_matches_reference() -> None:
    """numpy_kernel agrees with the float64 reference the generated kernels are checked by."""
    from tunecache.compiler.runtime import random_inputs, reference

    ops = [
        matmul_op(7, 5, 3, trans_a=True, trans_b=True, epilogue="bias+relu"),
        batch_matmul_op(3, 4, 5, 6, shared="a", trans_b=True, epilogue="bias"),
        batch_matmul_op(3, 4, 5, 6, shared="b", trans_a=True),
        conv2d_op(2, 4, 7, 6, 6, 3, 2, stride=(2, 1), pads=(1, 0, 2, 1),
                           dilation=(1, 2), groups=2, epilogue="bias+add+relu"),
        conv2d_op(1, 4, 5, 5, 8, 3, 3, pads=1, groups=4, epilogue="add"),
    ]
    for op in ops:
        inputs = random_inputs(op, seed=3)
        got = numpy_kernel(op)(*inputs)
        out_shape = next(a.shape for a in op.arguments() if a.role == "output")
        assert got.shape == out_shape and got.dtype == np.float32, op.text
        np.testing.assert_allclose(got, reference(op, inputs), rtol=1e-4, atol=1e-4,
                                   err_msg=op.text)


def test_executor_uses_given_kernels() -> None:
    graph = load_graph(models.mlp_model(13))
    calls: list[str] = []

    def spy(name: str, op: OpSignature) -> Kernel:
        inner = numpy_kernel(op)

        def kernel(*arrays: np.ndarray) -> np.ndarray:
            calls.append(name)
            expected = [a.shape for a in op.arguments() if a.role == "input"]
            assert [a.shape for a in arrays] == expected
            assert all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)
            return inner(*arrays)
        return kernel

    kernels = {n.name: spy(n.name, n.op) for n in graph.kernel_nodes}
    Executor(graph, kernels).run(models.random_feeds(models.mlp_model(13)))
    assert calls == [n.name for n in graph.kernel_nodes]
