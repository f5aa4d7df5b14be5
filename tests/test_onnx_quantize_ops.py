"""The ONNX quantization ops (compiler/onnx_ops/quantize.py) against onnxruntime: each op on a
one-node model (integer outputs exactly equal, edge cases included), then float models
quantized by onnxruntime's tools (QDQ, QOperator, dynamic) run end to end by compile_model."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_support as models
import pytest
from onnx import helper, numpy_helper

from tunecache.compiler.frontend import supported_ops
from tunecache.compiler.graph import ModelError
from tunecache.compiler.onnx_ops import OPS

Inputs = Sequence[tuple[str, "np.ndarray | None"]]

QUANT_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
             "ConvInteger", "QLinearMatMul", "QLinearConv")


def run_node(op: str, inputs: Inputs, *, feeds: int = 1, outputs: int = 1, opset: int = 13,
             **attrs: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``op`` on ``inputs`` by tunecache's implementation and by onnxruntime (the first
    ``feeds`` inputs fed, the rest initializers, None an omitted input): (ours, theirs)."""
    ort = pytest.importorskip("onnxruntime")
    names = [name if value is not None else "" for name, value in inputs]
    graph_inputs = [helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
        for name, value in inputs[:feeds] if value is not None]
    inits = [numpy_helper.from_array(np.asarray(value), name)
             for name, value in inputs[feeds:] if value is not None]
    outs = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, names, outs, **attrs)
    graph = helper.make_graph([node], op, graph_inputs,
                              [helper.make_value_info(o, onnx.TypeProto()) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=8 if opset < 21 else 10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = session.run(None, {name: value for name, value in inputs[:feeds]})
    ours = OPS[op]([value for _, value in inputs], dict(attrs), opset)
    return ours, theirs


def assert_same(ours: Sequence[np.ndarray], theirs: Sequence[np.ndarray]) -> None:
    """Equal values, dtypes and shapes, output by output (float outputs too: each is one
    float32 rounding of the same exact value on both sides)."""
    assert len(ours) == len(theirs)
    for got, want in zip(ours, theirs, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want)


def uniform_ints(rng: np.random.Generator, dtype: type, shape: Sequence[int]) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)


def operand_ints(rng: np.random.Generator, dtype: type, shape: Sequence[int]) -> np.ndarray:
    """A product's operand for comparisons with onnxruntime: int8 ones within 7 bits.

    Without AVX-512 VNNI, onnxruntime multiplies uint8 by int8 with vpmaddubsw, whose int16
    pair sums saturate for full-range values (its docs' reason for ``reduce_range``); the
    full range is checked against int64 arithmetic instead."""
    return uniform_ints(rng, dtype, shape) if dtype == np.uint8 else \
        rng.integers(-64, 64, size=shape).astype(dtype)


def ties(n: int, scale: float, spread: float) -> np.ndarray:
    """Values on and halfway between multiples of ``scale`` (a power of two, so ``x /
    scale`` is exact), spanning +-``spread`` steps: ties for rounding, and saturation."""
    return (np.linspace(-spread, spread, n) * 2).round().astype(np.float32) * np.float32(scale / 2)


def test_quantization_ops_are_supported() -> None:
    assert set(QUANT_OPS) <= set(supported_ops())


# -- QuantizeLinear / DequantizeLinear ------------------------------------------------------


@pytest.mark.parametrize("zp", [np.uint8(128), np.int8(-3), np.uint8(0), np.int8(127), None])
def test_quantize_per_tensor_ties_and_saturation(zp: np.generic | None) -> None:
    x = ties(801, 0.25, 300.0)
    assert_same(*run_node("QuantizeLinear", [("x", x), ("s", np.float32(0.25)), ("z", zp)]))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_quantize_per_tensor_random(dtype: type) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((4, 33)) * 2).astype(np.float32)
    zp = np.asarray(5, dtype=dtype)
    for scale in (0.0173, 0.01, 1 / 3, 0.0078125):
        assert_same(*run_node("QuantizeLinear", [("x", x), ("s", np.float32(scale)), ("z", zp)]))


@pytest.mark.parametrize(("axis", "dtype"), [(1, np.int8), (0, np.uint8), (-1, np.int8)])
def test_quantize_per_axis(axis: int, dtype: type) -> None:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((3, 4, 5)) * 3).astype(np.float32)
    n = x.shape[axis]
    scale = rng.uniform(0.005, 0.05, n).astype(np.float32)
    zp = uniform_ints(rng, dtype, (n,))
    assert_same(*run_node("QuantizeLinear", [("x", x), ("s", scale), ("z", zp)], axis=axis))


def test_quantize_opset10_and_opset21_forms() -> None:
    x = ties(201, 0.5, 300.0)
    assert_same(*run_node("QuantizeLinear", [("x", x), ("s", np.float32(0.5)),
                                             ("z", np.int8(2))], opset=10))
    # opset 21: output_dtype instead of a zero point, and 16-bit types.
    assert_same(*run_node("QuantizeLinear", [("x", x), ("s", np.float32(0.5))], opset=21,
                          output_dtype=onnx.TensorProto.INT8))
    wide = ties(201, 0.5, 70000.0)
    for zp in (np.int16(-7), np.uint16(1000)):
        assert_same(*run_node("QuantizeLinear", [("x", wide), ("s", np.float32(0.5)),
                                                 ("z", zp)], opset=21))


def test_quantize_refuses_blocked_and_unknown_types() -> None:
    x, s = np.ones((2, 4), np.float32), np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="block_size"):
        OPS["QuantizeLinear"]([x, s, None], {"axis": 1, "block_size": 2}, 21)
    with pytest.raises(ValueError, match="output_dtype"):
        OPS["QuantizeLinear"]([x, np.float32(1), None], {"output_dtype": 1}, 21)
    with pytest.raises(ValueError, match="does not fit"):
        OPS["DequantizeLinear"]([x.astype(np.int8), s, None], {"axis": 1, "block_size": 1}, 21)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32])
def test_dequantize_per_tensor(dtype: type) -> None:
    rng = np.random.default_rng(3)
    x = uniform_ints(rng, dtype, (5, 7)) if dtype != np.int32 else \
        rng.integers(-2**20, 2**20, (5, 7)).astype(np.int32)
    zp = None if dtype == np.int32 else np.asarray(-9 if dtype == np.int8 else 200, dtype=dtype)
    for scale in (0.0173, 3.0):
        assert_same(*run_node("DequantizeLinear", [("x", x), ("s", np.float32(scale)),
                                                   ("z", zp)]))
    # A zero point of 0 on int32 input (the spec's only one; onnxruntime refuses others).
    assert_same(*run_node("DequantizeLinear", [("x", x), ("s", np.float32(0.5)),
                                               ("z", np.zeros((), dtype))]))


@pytest.mark.parametrize(("axis", "dtype"), [(1, np.int8), (0, np.uint8), (-1, np.uint8)])
def test_dequantize_per_axis(axis: int, dtype: type) -> None:
    rng = np.random.default_rng(4)
    x = uniform_ints(rng, dtype, (3, 4, 5))
    n = x.shape[axis]
    inputs = [("x", x), ("s", rng.uniform(0.001, 0.1, n).astype(np.float32)),
              ("z", uniform_ints(rng, dtype, (n,)))]
    assert_same(*run_node("DequantizeLinear", inputs, axis=axis))


@pytest.mark.parametrize(("axis", "block"), [(1, 3), (0, 2), (-1, 7)])
def test_dequantize_blocked(axis: int, block: int) -> None:
    rng = np.random.default_rng(12)
    x = uniform_ints(rng, np.int8, (4, 7))
    shape = list(x.shape)
    shape[axis] = -(-shape[axis] // block)  # a last, partial block where it does not divide
    inputs = [("x", x), ("s", rng.uniform(0.01, 0.1, shape).astype(np.float32)),
              ("z", uniform_ints(rng, np.int8, shape))]
    assert_same(*run_node("DequantizeLinear", inputs, opset=21, axis=axis, block_size=block))


def test_int4_weight_only_model_folds_its_dequantize() -> None:
    """Blocked int4 weights, dequantized once at load time, feeding a MatMul kernel."""
    ort = pytest.importorskip("onnxruntime")
    from tunecache.compiler.executor import Executor
    from tunecache.compiler.frontend import load_graph

    rng = np.random.default_rng(13)
    w = helper.make_tensor("w", onnx.TensorProto.INT4, [16, 8],
                           rng.integers(-8, 8, 128).tolist())
    scale = numpy_helper.from_array(rng.uniform(0.01, 0.1, (2, 8)).astype(np.float32), "s")
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], axis=0, block_size=8),
             helper.make_node("MatMul", ["x", "wf"], ["y"])]
    graph = helper.make_graph(nodes, "int4", [helper.make_tensor_value_info("x", 1, [4, 16])],
                              [helper.make_tensor_value_info("y", 1, [4, 8])], [w, scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    loaded = load_graph(model)
    assert [n.op_type for n in loaded.onnx_nodes] == []
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(Executor(loaded).run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


def test_dequantize_int32_with_nonzero_zero_point() -> None:
    """Exact integer difference before the scale (onnxruntime only takes a zero of 0)."""
    x = np.array([2**30, -2**30, 7, 0], np.int32)
    (got,) = OPS["DequantizeLinear"]([x, np.float32(0.5), np.int32(7)], {}, 13)
    np.testing.assert_array_equal(got, ((x.astype(np.int64) - 7) * 0.5).astype(np.float32))


# -- DynamicQuantizeLinear -------------------------------------------------------------------


@pytest.mark.parametrize("case", ["random", "positive", "negative", "zeros", "ties", "constant"])
def test_dynamic_quantize(case: str) -> None:
    rng = np.random.default_rng(5)
    x = {
        "random": rng.standard_normal((6, 10)).astype(np.float32),
        "positive": rng.uniform(0.5, 4.0, (3, 8)).astype(np.float32),
        "negative": -rng.uniform(0.5, 4.0, (3, 8)).astype(np.float32),
        "zeros": np.zeros((4, 4), np.float32),
        "ties": np.arange(-255, 256, dtype=np.float32) / 2,
        "constant": np.full((5,), 2.5, np.float32),
    }[case]
    ours, theirs = run_node("DynamicQuantizeLinear", [("x", x)], outputs=3, opset=11)
    assert_same(ours, theirs)
    if case == "zeros":  # onnxruntime's scale for an all-zero range (the formula's is 0)
        assert float(ours[1]) == 1.0 and int(ours[2]) == 0


# -- MatMulInteger / ConvInteger -------------------------------------------------------------


@pytest.mark.parametrize(("a_type", "b_type"), [(np.uint8, np.uint8), (np.uint8, np.int8),
                                                (np.int8, np.int8)])
@pytest.mark.parametrize("b_zp_per_column", [False, True])
def test_matmul_integer(a_type: type, b_type: type, b_zp_per_column: bool) -> None:
    rng = np.random.default_rng(6)
    a, b = operand_ints(rng, a_type, (2, 5, 40)), operand_ints(rng, b_type, (40, 7))
    b_zp = uniform_ints(rng, b_type, (7,)) if b_zp_per_column else np.asarray(3, b_type)
    for a_zp in (np.asarray(0, a_type), uniform_ints(rng, a_type, ())):
        assert_same(*run_node("MatMulInteger", [("a", a), ("b", b), ("az", a_zp), ("bz", b_zp)],
                              feeds=2, opset=10))
    assert_same(*run_node("MatMulInteger", [("a", a), ("b", b)], feeds=2, opset=10))


def test_matmul_integer_per_row_a_zero_point() -> None:
    """A per-row a_zero_point (which onnxruntime's kernel does not take), against int64."""
    rng = np.random.default_rng(7)
    a, b = uniform_ints(rng, np.uint8, (6, 300)), uniform_ints(rng, np.int8, (300, 4))
    a_zp, b_zp = uniform_ints(rng, np.uint8, (6,)), uniform_ints(rng, np.int8, (4,))
    (got,) = OPS["MatMulInteger"]([a, b, a_zp, b_zp], {}, 10)
    want = (a.astype(np.int64) - a_zp[:, None].astype(np.int64)) @ (b.astype(np.int64) - b_zp)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


CONV_CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = {
    "pads-stride": ((1, 4, 7, 7), (6, 4, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "groups-dilation": ((2, 4, 9, 8), (6, 2, 3, 3), {"group": 2, "dilations": [2, 1],
                                                     "pads": [0, 1, 2, 1]}),
    "depthwise-same": ((1, 4, 6, 6), (4, 1, 3, 3), {"group": 4, "auto_pad": "SAME_UPPER"}),
    "1d": ((1, 3, 11), (5, 3, 3), {"pads": [1, 1], "strides": [2]}),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_integer(case: str) -> None:
    x_shape, w_shape, attrs = CONV_CASES[case]
    rng = np.random.default_rng(8)
    x, w = uniform_ints(rng, np.uint8, x_shape), uniform_ints(rng, np.uint8, w_shape)
    inputs = [("x", x), ("w", w), ("xz", np.uint8(131)), ("wz", np.uint8(120))]
    assert_same(*run_node("ConvInteger", inputs, opset=10, **attrs))
    assert_same(*run_node("ConvInteger", inputs[:2], opset=10, **attrs))


def test_conv_integer_per_channel_weight_zero_point() -> None:
    rng = np.random.default_rng(9)
    x, w = uniform_ints(rng, np.int8, (1, 3, 5, 5)), uniform_ints(rng, np.int8, (4, 3, 3, 3))
    w_zp = uniform_ints(rng, np.int8, (4,))
    (got,) = OPS["ConvInteger"]([x, w, np.int8(-5), w_zp], {"pads": [1, 1, 1, 1]}, 10)
    xc = np.pad(x.astype(np.int64) + 5, ((0, 0), (0, 0), (1, 1), (1, 1)))
    wc = w.astype(np.int64) - w_zp.reshape(4, 1, 1, 1)
    want = np.einsum("nchwrs,fcrs->nfhw",
                     np.lib.stride_tricks.sliding_window_view(xc, (3, 3), axis=(2, 3)), wc)
    np.testing.assert_array_equal(got, want)


# -- QLinearMatMul / QLinearConv -------------------------------------------------------------


@pytest.mark.parametrize(("a_type", "b_type", "y_type"), [
    (np.uint8, np.int8, np.uint8), (np.int8, np.int8, np.int8), (np.uint8, np.uint8, np.uint8)])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul(a_type: type, b_type: type, y_type: type, per_column: bool) -> None:
    rng = np.random.default_rng(10)
    a, b = operand_ints(rng, a_type, (3, 4, 32)), operand_ints(rng, b_type, (32, 6))
    if per_column:
        b_scale = rng.uniform(0.001, 0.01, 6).astype(np.float32)
        b_zp = np.zeros(6, b_type) if b_type == np.int8 else uniform_ints(rng, b_type, (6,))
    else:
        b_scale, b_zp = np.float32(0.0042), np.asarray(9, b_type)
    # y_scale small enough that some outputs saturate at each end.
    for y_scale in (np.float32(0.05), np.float32(0.002)):
        inputs = [("a", a), ("as", np.float32(0.02)), ("az", np.asarray(-3 if a_type == np.int8
                                                                        else 130, a_type)),
                  ("b", b), ("bs", b_scale), ("bz", b_zp), ("ys", y_scale),
                  ("yz", np.asarray(10, y_type))]
        ours, theirs = run_node("QLinearMatMul", inputs, opset=10)
        assert_same(ours, theirs)
    lo, hi = np.iinfo(y_type).min, np.iinfo(y_type).max
    assert (ours[0] == lo).any() and (ours[0] == hi).any()


@pytest.mark.parametrize("case", list(CONV_CASES))
@pytest.mark.parametrize(("x_type", "y_type"), [(np.uint8, np.uint8), (np.int8, np.int8)])
def test_qlinear_conv(case: str, x_type: type, y_type: type) -> None:
    x_shape, w_shape, attrs = CONV_CASES[case]
    rng = np.random.default_rng(11)
    x, w = operand_ints(rng, x_type, x_shape), operand_ints(rng, np.int8, w_shape)
    m = w_shape[0]
    for per_channel in (False, True):
        w_scale = (rng.uniform(0.002, 0.02, m).astype(np.float32) if per_channel
                   else np.float32(0.007))
        w_zp = np.zeros(m, np.int8) if per_channel else np.int8(0)
        bias = rng.integers(-3000, 3000, m).astype(np.int32)
        inputs = [("x", x), ("xs", np.float32(0.03)),
                  ("xz", np.asarray(128 if x_type == np.uint8 else -2, x_type)),
                  ("w", w), ("ws", w_scale), ("wz", w_zp), ("ys", np.float32(0.1)),
                  ("yz", np.asarray(100 if y_type == np.uint8 else 5, y_type)), ("b", bias)]
        assert_same(*run_node("QLinearConv", inputs, opset=10, **attrs))
        assert_same(*run_node("QLinearConv", inputs[:-1], opset=10, **attrs))


# -- quantized models end to end -------------------------------------------------------------


def mlp_model() -> onnx.ModelProto:
    b = models.Builder(13, seed=21)
    x = b.input("x", [8, 64])
    h = b.node("Add", [b.node("MatMul", [x, b.weight(64, 32)]), b.weight(32, scale=0.1)])
    h = b.node("Relu", [h])
    y = b.node("Add", [b.node("MatMul", [h, b.weight(32, 16)]), b.weight(16, scale=0.1)])
    return b.model([y], "mlp")


def cnn_model() -> onnx.ModelProto:
    b = models.Builder(13, seed=22)
    x = b.input("x", [1, 8, 16, 16])
    h = b.node("Relu", [b.conv(x, 8, 16, 3, bias=True)])
    return b.model([b.conv(h, 16, 8, 1, pad=0, bias=True)], "cnn")


def quantized(model: onnx.ModelProto, tmp_path: Path, how: str) -> Path:
    """``model`` quantized by onnxruntime's tools (``how``: qdq, qoperator, dynamic), saved.

    7-bit weights (``reduce_range``) keep onnxruntime's own results exact without VNNI (see
    :func:`operand_ints`)."""
    quantization = pytest.importorskip("onnxruntime.quantization")
    source, target = tmp_path / "float.onnx", tmp_path / f"{how}.onnx"
    onnx.save(model, source)
    if how == "dynamic":
        quantization.quantize_dynamic(source, target, reduce_range=True)
        return target
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]

    class Reader(quantization.CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            rng = np.random.default_rng(31)
            self.batches: Iterator[dict[str, np.ndarray]] = iter(
                [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    fmt = quantization.QuantFormat.QDQ if how == "qdq" else quantization.QuantFormat.QOperator
    # QOperator's quantized Add is com.microsoft's QLinearAdd, outside the default domain.
    only = ["MatMul", "Conv", "Relu"] if how == "qoperator" else None
    quantization.quantize_static(source, target, Reader(), quant_format=fmt,
                                 per_channel=how == "qdq", op_types_to_quantize=only,
                                 reduce_range=True)
    return target


def last_dequantize_scale(model: onnx.ModelProto) -> float:
    node = [n for n in model.graph.node if n.op_type == "DequantizeLinear"][-1]
    (init,) = [i for i in model.graph.initializer if i.name == node.input[1]]
    return float(numpy_helper.to_array(init))


def run_both(path: Path, tmp_path: Path, feeds: Mapping[str, np.ndarray]
             ) -> tuple[np.ndarray, np.ndarray]:
    """The first output of the model at ``path`` by compile_model and by onnxruntime (its
    default, fusing optimizations: the integer kernels)."""
    ort = pytest.importorskip("onnxruntime")
    from tunecache.cache.store import Store
    from tunecache.tuner.deploy import compile_model

    compiled = compile_model(path, store=Store(tmp_path / "store"), policy="analytic",
                             record_wanted=False)
    name = compiled.graph.outputs[0].name
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return compiled.run(dict(feeds))[name], session.run([name], dict(feeds))[0]


MODELS: dict[str, Callable[[], onnx.ModelProto]] = {"mlp": mlp_model, "cnn": cnn_model}


@pytest.mark.parametrize("how", ["qdq", "qoperator", "dynamic"])
@pytest.mark.parametrize("name", list(MODELS))
def test_quantized_model_matches_onnxruntime(name: str, how: str, tmp_path: Path) -> None:
    path = quantized(MODELS[name](), tmp_path, how)
    model = onnx.load(path)
    ops = {n.op_type for n in model.graph.node}
    expected_ops = {"qdq": {"QuantizeLinear", "DequantizeLinear"},
                    "qoperator": {"QLinearConv"} if name == "cnn" else {"QLinearMatMul"},
                    "dynamic": {"DynamicQuantizeLinear",
                                "ConvInteger" if name == "cnn" else "MatMulInteger"}}[how]
    assert expected_ops <= ops, ops
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = {"x": np.random.default_rng(41).standard_normal(shape).astype(np.float32)}
    got, want = run_both(path, tmp_path, feeds)
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    if how == "dynamic":  # float scaling after exact integer products on both sides
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    else:
        # One step of the output's quantization: a float product at a rounding tie may
        # land on the other side of it than onnxruntime's integer accumulation.
        step = last_dequantize_scale(model)
        np.testing.assert_allclose(got, want, rtol=0, atol=step * 1.001)


def test_com_microsoft_quantized_ops_are_refused(tmp_path: Path) -> None:
    """A QOperator MLP with every op quantized has com.microsoft's QLinearAdd: refused at
    load time, by name."""
    quantization = pytest.importorskip("onnxruntime.quantization")
    source, target = tmp_path / "float.onnx", tmp_path / "qop.onnx"
    onnx.save(mlp_model(), source)

    class Reader(quantization.CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.left = 2

        def get_next(self) -> dict[str, np.ndarray] | None:
            self.left -= 1
            return {"x": np.ones((8, 64), np.float32)} if self.left >= 0 else None

    quantization.quantize_static(source, target, Reader(),
                                 quant_format=quantization.QuantFormat.QOperator)
    from tunecache.compiler.frontend import load_graph

    with pytest.raises(ModelError, match=r"com\.microsoft\.QLinearAdd"):
        load_graph(target)
