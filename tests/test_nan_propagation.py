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


SPECIALS = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}


def _with_specials(shape: tuple[int, ...], special: float, seed: int = 5) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[[5, 77 % flat.size, flat.size - 3]] = special
    return x


def _run_both(path: Path, x: np.ndarray, tmp_path: Path) -> tuple[np.ndarray, np.ndarray]:
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    compiled = compile_model(path, store=tmp_path / "store", policy="analytic")
    assert any(e.schedule is not None for e in compiled.plan), "no kernel ran"
    return compiled.run({"x": x})["y"], theirs


def _assert_same_specials(ours: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(ours), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(want))
    both = np.isfinite(ours) & np.isfinite(want)
    np.testing.assert_allclose(ours[both], want[both], rtol=1e-3, atol=1e-4)


def _gelu_nodes() -> list[onnx.NodeProto]:
    return [helper.make_node("Mul", ["x", "h"], ["a"]), helper.make_node("Erf", ["a"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["x", "p"], ["q"]),
            helper.make_node("Mul", ["q", "half"], ["y"])]


KINDS = {  # name: (nodes, x shape, y shape, weights); onnxruntime is the reference
    "average pool": ([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3],
                                       strides=[2, 2], pads=[1, 1, 1, 1])],
                     (1, 16, 14, 14), (1, 16, 7, 7), {}),
    "global average pool": ([helper.make_node("GlobalAveragePool", ["x"], ["y"])],
                            (1, 16, 14, 14), (1, 16, 1, 1), {}),
    "softmax": ([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], (8, 64), (8, 64), {}),
    "layernorm": ([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
                  (8, 64), (8, 64), {"g": np.ones(64), "b": np.zeros(64)}),
    "sigmoid": ([helper.make_node("Sigmoid", ["x"], ["y"])], (8, 64), (8, 64), {}),
    "tanh": ([helper.make_node("Tanh", ["x"], ["y"])], (8, 64), (8, 64), {}),
    "erf": ([helper.make_node("Erf", ["x"], ["y"])], (8, 64), (8, 64), {}),
    # e**x past ln of the largest float is inf (exp(inf), exp(100)), so SiLU(-inf) is NaN
    "exp": ([helper.make_node("Mul", ["x", "big"], ["b"]), helper.make_node("Exp", ["b"], ["y"])],
            (8, 64), (8, 64), {"big": np.array(40.0)}),
    "silu": ([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
             (8, 64), (8, 64), {}),
    "gelu": (_gelu_nodes(), (8, 64), (8, 64),
             {"h": np.array(0.7071), "one": np.array(1.0), "half": np.array(0.5)}),
    "batch matmul": ([helper.make_node("MatMul", ["x", "w"], ["y"])], (4, 16, 32), (4, 16, 24),
                     {"w": np.random.default_rng(0).standard_normal((4, 32, 24))}),
    "add then max": ([helper.make_node("Add", ["x", "b"], ["s"]),
                      helper.make_node("Max", ["s", "c"], ["y"])], (8, 64), (8, 64),
                     {"b": np.linspace(-1, 1, 64), "c": np.linspace(1, -1, 64)}),
    "add then min": ([helper.make_node("Add", ["x", "b"], ["s"]),
                      helper.make_node("Min", ["s", "c"], ["y"])], (8, 64), (8, 64),
                     {"b": np.linspace(-1, 1, 64), "c": np.linspace(1, -1, 64)}),
}


@pytest.mark.parametrize("special", list(SPECIALS))
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_passes_nan_and_inf_as_onnxruntime_does(tmp_path: Path, kind: str,
                                                           special: str) -> None:
    nodes, xs, ys, weights = KINDS[kind]
    path = _model(tmp_path / "k.onnx", nodes, xs, ys, weights)
    ours, theirs = _run_both(path, _with_specials(xs, SPECIALS[special]), tmp_path)
    _assert_same_specials(ours, theirs)


def _max_pool_reference(x: np.ndarray, k: int, stride: int, pad: int) -> np.ndarray:
    padded = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (pad, pad), (pad, pad)],
                    constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(2, 3))
    return windows[:, :, ::stride, ::stride].max(axis=(-2, -1))  # NaN wins, as np.max


@pytest.mark.parametrize("blocked", [False, True])
def test_max_pool_never_hides_nan(tmp_path: Path, blocked: bool) -> None:
    # onnxruntime's MaxPool keeps a NaN only where it happens to come first in a window
    # (here 2 of the 8 windows holding one); ours, as numpy's max, in every window.
    pool = helper.make_node("MaxPool", ["p" if blocked else "x"], ["y"], kernel_shape=[3, 3],
                            strides=[2, 2], pads=[1, 1, 1, 1])
    nodes, weights, c = [pool], {}, 16
    if blocked:  # a 1x1 conv before it: the pool reads its channel-blocked output
        rng = np.random.default_rng(7)
        weights = {"w": np.eye(c).reshape(c, c, 1, 1) + rng.random((c, c, 1, 1)) * 1e-3}
        nodes.insert(0, helper.make_node("Conv", ["x", "w"], ["p"]))
    path = _model(tmp_path / "pool.onnx", nodes, (1, c, 14, 14), (1, c, 7, 7), weights)
    x = _with_specials((1, c, 14, 14), np.nan)
    ours, theirs = _run_both(path, x, tmp_path)
    assert np.isnan(ours[np.isnan(theirs)]).all()
    source = np.einsum("fc,nchw->nfhw", weights["w"][:, :, 0, 0], x) if blocked else x
    want = _max_pool_reference(source, 3, 2, 1)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(want))


def test_global_max_pool_never_hides_nan(tmp_path: Path) -> None:
    nodes = [helper.make_node("GlobalMaxPool", ["x"], ["y"])]
    path = _model(tmp_path / "gmp.onnx", nodes, (1, 16, 9, 9), (1, 16, 1, 1), {})
    x = _with_specials((1, 16, 9, 9), np.nan)
    ours, _ = _run_both(path, x, tmp_path)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(x.max(axis=(2, 3), keepdims=True)))


@pytest.mark.parametrize("special", list(SPECIALS))
def test_a_quantize_step_maps_nan_and_inf_as_onnxruntime_does(tmp_path: Path,
                                                              special: str) -> None:
    # An integer holds no NaN: QuantizeLinear sends it to the low end, +-inf to the ends; the
    # element-wise chain that folds a quantize-dequantize pair clamps the same way.
    nodes = [helper.make_node("Add", ["x", "b"], ["s"]),
             helper.make_node("QuantizeLinear", ["s", "scale", "zero"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"])]
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])],
        [numpy_helper.from_array(np.linspace(-1, 1, 64).astype(np.float32), "b"),
         numpy_helper.from_array(np.array(0.05, np.float32), "scale"),
         numpy_helper.from_array(np.array(128, np.uint8), "zero")])
    path = tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    ours, theirs = _run_both(path, _with_specials((8, 64), SPECIALS[special]), tmp_path)
    _assert_same_specials(ours, theirs)


def _lrn_reference(x: np.ndarray, size: int, alpha: float = 1e-4, beta: float = 0.75,
                   bias: float = 1.0) -> np.ndarray:
    """ONNX's LRN in float64: each channel normalised by the squares of its ``size``
    neighbours (NaN or inf in one reaches those ``size`` channels, no further)."""
    x = x.astype(np.float64)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = np.pad(x * x, [(0, 0), (lo, hi), (0, 0), (0, 0)])
    window = sum(padded[:, i:i + x.shape[1]] for i in range(size))
    return x / (bias + alpha / size * window) ** beta


@pytest.mark.parametrize("beta", [0.75, 0.5])  # the square-root path and exp(-beta ln t)
@pytest.mark.parametrize("special", list(SPECIALS))
def test_lrn_passes_nan_and_inf_to_the_channels_that_see_them(tmp_path: Path, special: str,
                                                              beta: float) -> None:
    # onnxruntime's LRN keeps a running sum over channels, so one NaN or inf reaches every
    # later channel of its pixel; the operator's definition (and ours) reaches its window.
    nodes = [helper.make_node("LRN", ["x"], ["y"], size=5, beta=beta)]
    path = _model(tmp_path / "lrn.onnx", nodes, (1, 16, 8, 8), (1, 16, 8, 8), {})
    x = _with_specials((1, 16, 8, 8), SPECIALS[special])
    ours, theirs = _run_both(path, x, tmp_path)
    with np.errstate(invalid="ignore"):  # inf / inf where the inf itself is normalised
        want = _lrn_reference(x, 5, beta=beta)
    assert np.isnan(theirs[np.isnan(want)]).all()  # theirs: a superset
    _assert_same_specials(ours, want)


def test_reduce_max_never_hides_nan(tmp_path: Path) -> None:
    # onnxruntime's ReduceMax returns the largest number of a row holding a NaN.
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("ReduceMax", ["r"], ["y"], axes=[1], keepdims=1)]
    path = _model(tmp_path / "rmax.onnx", nodes, (8, 64), (8, 1), {})
    x = _with_specials((8, 64), np.nan)
    ours, _ = _run_both(path, x, tmp_path)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(x.max(axis=1, keepdims=True)))
