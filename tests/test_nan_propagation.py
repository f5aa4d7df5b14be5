"""NaN is never hidden (issue 55): a NaN input reaches the outputs of kernels with fused
activations as onnxruntime's Relu and Clip pass it on, in compiled models (convolutions of
several algorithms, depthwise, matmul, Gemm, element-wise chains) on the host's ISA level."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tunecache.tuner.deploy import compile_model

ort = pytest.importorskip("onnxruntime")


def _model(path: Path, nodes: list[onnx.NodeProto], x: tuple[int, ...], y: tuple[int, ...],
           weights: dict[str, np.ndarray]) -> Path:
    graph = helper.make_graph(
        nodes, "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y))],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _conv(act: str, c: int, f: int, k: int, stride: int, groups: int = 1) -> tuple[
        list[onnx.NodeProto], dict[str, np.ndarray]]:
    rng = np.random.default_rng(c * k + f)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[k // 2] * 4,
                              strides=[stride] * 2, group=groups)]
    weights = {"w": rng.standard_normal((f, c // groups, k, k)) / k, "b": rng.random(f),
               "lo": np.array(0.0), "hi": np.array(6.0)}
    nodes.append(helper.make_node("Relu", ["c"], ["y"]) if act == "relu"
                 else helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    return nodes, weights


CONVS = {  # name: (C, F, kernel, stride, groups)
    "pointwise": (16, 32, 1, 1, 1),
    "strided 3x3": (16, 32, 3, 2, 1),
    "3x3": (32, 32, 3, 1, 1),
    "depthwise": (32, 32, 3, 1, 32),
}


def _compare(path: Path, x: np.ndarray, tmp_path: Path, *, exact_mask: bool = True) -> None:
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    ours = compile_model(path, store=tmp_path / "store", policy="analytic").run({"x": x})["y"]
    assert np.isnan(theirs).any()
    # Never hidden: NaN wherever onnxruntime has it; a Winograd tile may spread it further.
    assert np.isnan(ours[np.isnan(theirs)]).all(), \
        f"{int(np.isnan(theirs).sum() - np.isnan(ours[np.isnan(theirs)]).sum())} NaN hidden"
    if exact_mask:
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    both = ~np.isnan(ours) & ~np.isnan(theirs)
    np.testing.assert_allclose(ours[both], theirs[both], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act", ["relu", "clip6"])
@pytest.mark.parametrize("name", list(CONVS))
def test_convolutions_with_activations_keep_nan(tmp_path: Path, act: str, name: str) -> None:
    c, f, k, stride, groups = CONVS[name]
    nodes, weights = _conv(act, c, f, k, stride, groups)
    h = 14
    out = (h + 2 * (k // 2) - k) // stride + 1
    path = _model(tmp_path / "conv.onnx", nodes, (1, c, h, h), (1, f, out, out), weights)
    x = np.random.default_rng(1).standard_normal((1, c, h, h)).astype(np.float32)
    x[0, :, 3, 4] = np.nan
    x[0, 2, 9, 9] = np.nan
    _compare(path, x, tmp_path, exact_mask=name != "3x3")


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
@pytest.mark.parametrize("act", ["relu", "clip6"])
def test_products_with_activations_keep_nan(tmp_path: Path, op: str, act: str) -> None:
    rng = np.random.default_rng(2)
    weights = {"w": rng.standard_normal((64, 48)) / 8, "b": rng.random(48),
               "lo": np.array(0.0), "hi": np.array(6.0)}
    first = (helper.make_node("MatMul", ["x", "w"], ["m"]) if op == "MatMul"
             else helper.make_node("Gemm", ["x", "w", "b"], ["m"]))
    last = (helper.make_node("Relu", ["m"], ["y"]) if act == "relu"
            else helper.make_node("Clip", ["m", "lo", "hi"], ["y"]))
    path = _model(tmp_path / "mm.onnx", [first, last], (32, 64), (32, 48), weights)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    x[[3, 17], [5, 40]] = np.nan
    _compare(path, x, tmp_path)


def test_element_wise_activations_keep_nan(tmp_path: Path) -> None:
    nodes = [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Clip", ["r", "lo", "hi"], ["y"])]
    weights = {"b": np.linspace(-1, 1, 40), "lo": np.array(0.0), "hi": np.array(6.0)}
    path = _model(tmp_path / "ew.onnx", nodes, (8, 40), (8, 40), weights)
    x = np.random.default_rng(3).standard_normal((8, 40)).astype(np.float32) * 4
    x[1, 7] = x[6, 39] = np.nan
    _compare(path, x, tmp_path)


def test_pointwise_then_depthwise_keeps_nan(tmp_path: Path) -> None:
    # MobileNet's expansion: a 1x1 conv, ReLU6, a depthwise 3x3, ReLU6 (one pwdw kernel).
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["p"]),
             helper.make_node("Clip", ["p", "lo", "hi"], ["pr"]),
             helper.make_node("Conv", ["pr", "w2", "b2"], ["d"], pads=[1, 1, 1, 1], group=64),
             helper.make_node("Clip", ["d", "lo", "hi"], ["y"])]
    weights = {"w1": rng.standard_normal((64, 16, 1, 1)) / 4, "b1": rng.random(64),
               "w2": rng.standard_normal((64, 1, 3, 3)) / 3, "b2": rng.random(64),
               "lo": np.array(0.0), "hi": np.array(6.0)}
    path = _model(tmp_path / "pwdw.onnx", nodes, (1, 16, 14, 14), (1, 64, 14, 14), weights)
    x = rng.standard_normal((1, 16, 14, 14)).astype(np.float32)
    x[0, 3, 5, 6] = np.nan
    _compare(path, x, tmp_path)
