"""Element-wise chains over a quantized convolution's channels, folded into its epilogue
(issue 53): the channel steps (``cadd ... cmin``, ``qround``) rendered with one operand row
each, run by the int8 and bf16 conv2d kernels on every ISA level this machine runs, and the
step pass that folds an unfolded BatchNormalization and its quantize-dequantize pairs into
the convolution of an onnxruntime-quantized model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_support import quantization_steps, quantize_qdq

from tunecache.compiler import frontend
from tunecache.compiler.codegen.epilogue import chain_rows, reference, render
from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.hardware import HardwareSpec, local_spec, runnable_isas
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.runtime import compile_kernel, random_inputs
from tunecache.compiler.runtime import reference as op_reference
from tunecache.compiler.schedule import default_schedule, problems
from tunecache.tuner.deploy import compile_model

HW = local_spec()
SPECS = [*(replace(HW.with_isa(isa), features=()) for isa in runnable_isas(HW))]
if HW.features:
    SPECS.append(HW.with_isa(HW.isa))
QDQ_BN = "dequant+bias+cdiv+cmax+cmin+qround+cmul+cmul+cadd"


def test_channel_steps_read_one_operand_row_each() -> None:
    steps = ("cmul", "qround", "cadd", "cmax")
    assert chain_rows(steps) == 3
    c = render(steps, "v", {"chan": "VLOADU(chan + {i} * F + f)"}, vector=True)
    assert [f"chan + {i} * F" in c for i in range(3)] == [True] * 3
    rows = np.array([[2.0], [0.5], [1.0]])
    out = reference(steps, np.array([1.2, -1.3, 0.26]), {"chan": rows})
    np.testing.assert_array_equal(out, [2.5, 1.0, 1.5])  # 2.4 -> 2, -2.6 -> -3, .52 -> 1


def test_only_low_precision_convolutions_take_a_chain() -> None:
    conv2d_op(1, 16, 8, 8, 32, 3, 3, pads=1, dtype="int8", epilogue=QDQ_BN)
    conv2d_op(1, 16, 8, 8, 32, 3, 3, pads=1, dtype="bf16", epilogue="bias+cmul+qround")
    with pytest.raises(OpSignatureError, match="int8 or bf16"):
        conv2d_op(1, 16, 8, 8, 32, 3, 3, pads=1, epilogue="bias+cmul")
    with pytest.raises(OpSignatureError, match="'bias' is not supported"):
        conv2d_op(1, 16, 8, 8, 32, 3, 3, dtype="int8", epilogue="dequant+cmul+bias")


def _exact_inputs(op: object, seed: int) -> tuple[np.ndarray, ...]:
    """Inputs whose every epilogue step is exact in float32 (unit scales, integer bias,
    power-of-two chain constants): kernel and reference must agree bit for bit, ties of the
    rounding included."""
    x, w, qa, scale, *_ = random_inputs(op, seed=seed)  # type: ignore[arg-type]
    rng = np.random.default_rng(seed)
    f = scale.size
    rows = [np.full(f, 4.0), np.full(f, -40.0), np.full(f, 40.0),  # /4, clamp to +-40
            np.full(f, 0.5), rng.choice([0.25, 2.0, -1.0], f), rng.integers(-3, 4, f) + 0.5]
    return (x, w, qa, np.ones(f, np.float32), rng.integers(-20, 20, f).astype(np.float32),
            np.stack(rows).astype(np.float32))


@pytest.mark.parametrize("hw", SPECS, ids=[s.isa + "+".join(("", *s.features)) for s in SPECS])
@pytest.mark.parametrize("layout", ["nchw", "nchw16c"])
def test_int8_convolution_applies_the_chain_exactly(hw: HardwareSpec, layout: str) -> None:
    op = conv2d_op(1, 20, 9, 7, 40, 3, 3, pads=1, dtype="int8", epilogue=QDQ_BN,
                   layout=layout, out_layout=layout)
    inputs = _exact_inputs(op, seed=3)
    want = op_reference(op, inputs)
    assert np.unique(want).size > 20  # the chain is not all clamped away
    for threads in (1, 2):
        got = compile_kernel(op, default_schedule(op, hw, threads), hw)(*inputs)
        np.testing.assert_array_equal(got, want.astype(np.float32))


def _float(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def _save(path: Path, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto],
          x_shape: list[int], y_shape: list[int]) -> Path:
    """The graph ``x -> nodes -> y`` as an opset-17 model at ``path``."""
    graph = helper.make_graph(
        nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _bn_cnn(path: Path) -> Path:
    """x -> Conv 3x3 (32) -> BatchNormalization -> Clip(0, 6) -> Conv 1x1 (24): a network
    whose BatchNormalization was not folded before quantization."""
    rng = np.random.default_rng(11)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "g", "beta", "mu", "var"], ["n1"]),
             helper.make_node("Clip", ["n1", "lo", "hi"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"])]
    inits = [_float("w1", rng.standard_normal((32, 16, 3, 3)) / 12), _float("b1", rng.random(32)),
             _float("g", 0.5 + rng.random(32)), _float("beta", rng.standard_normal(32) * 0.1),
             _float("mu", rng.standard_normal(32) * 0.1), _float("var", 0.5 + rng.random(32)),
             _float("lo", np.array(0.0)), _float("hi", np.array(6.0)),
             _float("w2", rng.standard_normal((24, 32, 1, 1)) / 6), _float("b2", rng.random(24))]
    return _save(path, nodes, inits, [1, 16, 10, 10], [1, 24, 10, 10])


def _quantized(build: Any, tmp_path: Path, shape: tuple[int, ...], seed: int
               ) -> tuple[Path, np.random.Generator]:
    """The model ``build`` writes, quantized by onnxruntime (static QDQ) on four seeded
    batches of ``x``; and the generator for the test's own input."""
    rng = np.random.default_rng(seed)
    path = quantize_qdq(build(tmp_path / "model.onnx"), tmp_path / "model.int8.onnx",
                        [{"x": rng.standard_normal(shape).astype(np.float32)}
                         for _ in range(4)])
    return path, rng


def _steps_from_onnxruntime(path: Path, x: np.ndarray, tmp_path: Path) -> float:
    ours = compile_model(path, store=tmp_path / "store", policy="analytic").run({"x": x})["y"]
    return quantization_steps(path, {"x": x}, ours)


def test_quantized_batchnorm_chain_joins_the_convolution(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime.quantization")
    path, rng = _quantized(_bn_cnn, tmp_path, (1, 16, 10, 10), seed=12)
    graph = frontend.load_graph(path)
    first = graph.kernel_nodes[0]
    assert (first.op.kind, first.op.dtype) == ("conv2d", "int8")
    assert chain_rows(first.op.epilogue) >= 6  # pair, BatchNormalization, pair, Clip, pair
    assert not [n for n in graph.kernel_nodes if n.op.kind == "elementwise"
                and graph.kernel_nodes.index(n) < 2]
    x = rng.standard_normal((1, 16, 10, 10)).astype(np.float32)
    steps = _steps_from_onnxruntime(path, x, tmp_path)
    assert steps <= 1.0 + 1e-4, f"{steps:.3f} quantization steps apart"


MATMUL_CHAIN = "dequant+bias+cdiv+cmax+cmin+qround+cmul+cadd"


@pytest.mark.parametrize("hw", SPECS, ids=[s.isa + "+".join(("", *s.features)) for s in SPECS])
@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_low_precision_matmul_applies_a_chain_over_its_columns(hw: HardwareSpec,
                                                               dtype: str) -> None:
    epilogue = MATMUL_CHAIN if dtype == "int8" else MATMUL_CHAIN.replace("dequant+", "")
    op = matmul_op(37, 70, 99, dtype=dtype, a_type="float32", epilogue=epilogue)
    inputs = list(random_inputs(op, seed=5))
    n = op.dim("N")
    rng = np.random.default_rng(5)
    inputs[-1] = np.stack([np.full(n, 0.25), np.full(n, -20.0), np.full(n, 20.0),
                           rng.choice([0.5, 2.0], n), rng.integers(-3, 4, n)]).astype(np.float32)
    want = op_reference(op, tuple(inputs))
    for threads in (1, 2):
        got = compile_kernel(op, default_schedule(op, hw, threads), hw)(*inputs)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    with pytest.raises(OpSignatureError, match="int8 or bf16"):
        matmul_op(8, 8, 8, epilogue="bias+cmul")


def _mlp(path: Path) -> Path:
    """x -> MatMul (64) -> Add bias -> Relu -> MatMul (32): what onnxruntime quantizes into
    quantize-dequantize pairs around the bias and the activation."""
    rng = np.random.default_rng(21)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) / 8).astype(np.float32), name)
             for name, shape in (("w1", (48, 64)), ("b1", (64,)), ("w2", (64, 32)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 48])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 32])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_quantized_bias_and_activation_chain_joins_the_matmul(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime.quantization")
    path, rng = _quantized(_mlp, tmp_path, (16, 48), seed=22)
    graph = frontend.load_graph(path)
    if graph.kernel_nodes[0].op.dtype != "int8":
        pytest.skip("this CPU runs QDQ products as float32 kernels (no int8 dot product)")
    first = graph.kernel_nodes[0]
    assert first.op.kind == "matmul" and chain_rows(first.op.epilogue) >= 4
    assert graph.kernel_nodes[1].op.kind == "matmul"  # no element-wise kernel between
    steps = _steps_from_onnxruntime(path, rng.standard_normal((16, 48)).astype(np.float32),
                                    tmp_path)
    assert steps <= 1.0 + 1e-4, f"{steps:.3f} quantization steps apart"


@pytest.mark.parametrize("hw", SPECS, ids=[s.isa + "+".join(("", *s.features)) for s in SPECS])
@pytest.mark.parametrize("layout", ["nchw", "nchw16c"])
def test_a_residual_within_the_chain_is_added_in_place(hw: HardwareSpec, layout: str) -> None:
    op = conv2d_op(1, 20, 9, 7, 40, 3, 3, pads=1, dtype="int8", epilogue=QDQ_BN + "+radd+relu",
                   layout=layout, out_layout=layout)
    exact, add = _exact_inputs(op, seed=4), random_inputs(op, seed=4)[5]
    inputs = (*exact[:5], add, exact[-1])
    want = op_reference(op, inputs)
    got = compile_kernel(op, default_schedule(op, hw, 2), hw)(*inputs)
    np.testing.assert_array_equal(got, want.astype(np.float32))


def _residual_cnn(path: Path) -> Path:
    """x -> Conv 3x3 (16) -> Relu -> Conv 1x1 (16) -> Add x -> Relu -> Conv 1x1 (8)."""
    rng = np.random.default_rng(31)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) / 6).astype(np.float32), name)
             for name, shape in (("w1", (16, 16, 3, 3)), ("b1", (16,)), ("w2", (16, 16, 1, 1)),
                                 ("b2", (16,)), ("w3", (8, 16, 1, 1)), ("b3", (8,)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"]),
             helper.make_node("Add", ["c2", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["y"])]
    graph = helper.make_graph(
        nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 9, 9])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_quantized_residual_add_joins_the_convolution(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("onnxruntime.quantization")
    path, rng = _quantized(_residual_cnn, tmp_path, (1, 16, 9, 9), seed=32)
    graph = frontend.load_graph(path)
    convs = [n for n in graph.kernel_nodes if n.op.kind == "conv2d"]
    if convs[0].op.dtype != "int8":
        pytest.skip("this CPU runs QDQ products as float32 kernels (no int8 dot product)")
    others = [n.op for n in graph.kernel_nodes if n.op.kind != "conv2d"]
    assert all(op.attr("operand") != "full" for op in others)  # x's own pair, no add
    assert "radd" in convs[1].op.epilogue
    x = {"x": rng.standard_normal((1, 16, 9, 9)).astype(np.float32)}
    folded = compile_model(path, store=tmp_path / "store", policy="analytic").run(x)["y"]
    from tunecache.compiler.lowering import chains
    monkeypatch.setattr(chains, "_residual", lambda *args: None)
    apart = compile_model(path, store=tmp_path / "store", policy="analytic").run(x)["y"]
    np.testing.assert_array_equal(folded, apart)  # the same floats, one kernel fewer


@pytest.mark.parametrize("hw", SPECS, ids=[s.isa + "+".join(("", *s.features)) for s in SPECS])
@pytest.mark.parametrize("layout", ["nchw", "nchw16c"])
def test_float32_depthwise_convolution_applies_a_chain(hw: HardwareSpec, layout: str) -> None:
    # A quantized MobileNet's depthwise layers stay float32 (their weights dequantized) and
    # take the pair and BatchNormalization after them into their stores.
    for stride in (1, 2):
        op = conv2d_op(1, 32, 13, 13, 32, 3, 3, stride=stride, pads=1, groups=32,
                       layout=layout, out_layout=layout, epilogue="bias+" + QDQ_BN[13:])
        inputs = random_inputs(op, seed=stride)
        got = compile_kernel(op, default_schedule(op, hw, 2), hw)(*inputs)
        want = op_reference(op, inputs)
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("hw", SPECS, ids=[s.isa + "+".join(("", *s.features)) for s in SPECS])
@pytest.mark.parametrize("layout", ["nchw", "nchw16c"])
def test_float32_depthwise_convolution_writes_a_quantized_output(hw: HardwareSpec,
                                                                 layout: str) -> None:
    # Its chain ending with the quantizer, it stores bytes for the int8 convolution after it.
    op = conv2d_op(1, 32, 13, 13, 32, 3, 3, pads=1, groups=32, layout=layout,
                   out_layout=layout, narrow="y", epilogue="bias+cmul+cadd+cdiv+cmax+cmin+qround+cadd")
    inputs = random_inputs(op, seed=4)
    got = compile_kernel(op, default_schedule(op, hw, 2), hw)(*inputs)
    assert got.dtype == np.uint8 and len(np.unique(got)) > 32
    assert np.abs(got.astype(np.float64) - op_reference(op, inputs)).max() <= 1.0


@pytest.mark.parametrize("hw", SPECS, ids=[s.isa + "+".join(("", *s.features)) for s in SPECS])
@pytest.mark.parametrize("layout", ["nchw", "nchw16c"])
@pytest.mark.parametrize("held", ["x", "x+y"])
def test_float32_depthwise_convolution_reads_a_quantized_input(hw: HardwareSpec, layout: str,
                                                               held: str) -> None:
    # Its X as bytes, dequantized with xq as the kernel copies X with its zero border.
    op = conv2d_op(1, 32, 13, 11, 32, 3, 3, pads=1, stride=2, groups=32, layout=layout,
                   out_layout=layout, narrow=held,
                   epilogue="bias+cmul+cadd+cdiv+cmax+cmin+qround+cadd")
    assert [a.name for a in op.arguments()][-2:] == ["xq", "Y"]
    inputs = random_inputs(op, seed=5)
    assert inputs[0].dtype == np.uint8
    got = compile_kernel(op, default_schedule(op, hw, 2), hw)(*inputs)
    want = op_reference(op, inputs)
    if held == "x":
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    else:
        assert np.abs(got.astype(np.float64) - want).max() <= 1.0


def test_a_float32_chain_needs_a_whole_block_depthwise_direct_kernel() -> None:
    chain = "bias+cmul+cadd"
    with pytest.raises(OpSignatureError, match="depthwise"):
        conv2d_op(1, 32, 8, 8, 32, 3, 3, pads=1, epilogue=chain)  # dense
    with pytest.raises(OpSignatureError, match="depthwise"):
        conv2d_op(1, 24, 8, 8, 24, 3, 3, pads=1, groups=24, epilogue=chain)  # 24 channels
    with pytest.raises(OpSignatureError, match="uint8 Y only"):
        conv2d_op(1, 32, 8, 8, 32, 3, 3, pads=1, groups=32, epilogue=chain, narrow="y")
    with pytest.raises(OpSignatureError, match="uint8 X only"):  # unpadded: read in place
        conv2d_op(1, 32, 8, 8, 32, 3, 3, groups=32, epilogue=chain, narrow="x")
    op = conv2d_op(1, 32, 8, 8, 32, 3, 3, pads=1, groups=32, epilogue=chain)
    plane = replace(default_schedule(op, HW, 1), pack_w=0)
    assert any("pack_w=1" in p for p in problems(op, plane, HW))


def test_quantized_depthwise_chain_joins_the_convolution(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime.quantization")
    path, rng = _quantized(_depthwise_cnn, tmp_path, (1, 32, 10, 10), seed=14)
    graph = frontend.load_graph(path)
    convs = [n.op for n in graph.kernel_nodes if n.op.kind == "conv2d"]
    assert (convs[0].dtype, convs[0].dim("groups")) == ("float32", 32)
    assert chain_rows(convs[0].epilogue) >= 2  # the pair and the normalization, composed
    # Only x's own pair is left element-wise (a float32 kernel reads the pair's output).
    assert [n.op.kind for n in graph.kernel_nodes].count("elementwise") == 1
    if convs[1].dtype == "int8":  # which reads the depthwise output as bytes
        assert convs[0].attr("narrow") == "y" and convs[1].attr("narrow") == "x"
    x = rng.standard_normal((1, 32, 10, 10)).astype(np.float32)
    steps = _steps_from_onnxruntime(path, x, tmp_path)
    assert steps <= 1.0 + 1e-4, f"{steps:.3f} quantization steps apart"


def test_an_int8_convolution_hands_the_depthwise_after_it_bytes(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime.quantization")
    path, rng = _quantized(_expand_depthwise_cnn, tmp_path, (1, 16, 10, 10), seed=15)
    graph = frontend.load_graph(path)
    convs = [n for n in graph.kernel_nodes if n.op.kind == "conv2d"]
    if convs[0].op.dtype == "int8":  # a MobileNet block: expand, depthwise, project
        assert [c.op.attr("narrow") for c in convs] == ["y", "x+y", "x"]
        assert convs[1].op.dtype == "float32" and convs[1].op.dim("groups") == 32
        xq = graph.constants[convs[1].inputs[-1]]
        assert xq.shape == (2,) and xq[0] > 0 and xq[1] == round(float(xq[1]))
    x = rng.standard_normal((1, 16, 10, 10)).astype(np.float32)
    steps = _steps_from_onnxruntime(path, x, tmp_path)
    assert steps <= 1.0 + 1e-4, f"{steps:.3f} quantization steps apart"


def _expand_depthwise_cnn(path: Path) -> Path:
    """x -> Conv 1x1 (16 -> 32) -> Relu -> depthwise Conv 3x3 -> BatchNormalization ->
    Relu -> Conv 1x1 (16)."""
    rng = np.random.default_rng(16)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1], group=32),
             helper.make_node("BatchNormalization", ["c1", "g", "beta", "mu", "var"], ["n1"]),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"])]
    inits = [_float("w0", rng.standard_normal((32, 16, 1, 1)) / 4), _float("b0", rng.random(32)),
             _float("w1", rng.standard_normal((32, 1, 3, 3)) / 3),
             _float("g", 0.5 + rng.random(32)), _float("beta", rng.standard_normal(32) * 0.1),
             _float("mu", rng.standard_normal(32) * 0.1), _float("var", 0.5 + rng.random(32)),
             _float("w2", rng.standard_normal((16, 32, 1, 1)) / 6), _float("b2", rng.random(16))]
    return _save(path, nodes, inits, [1, 16, 10, 10], [1, 16, 10, 10])


def _depthwise_cnn(path: Path) -> Path:
    """x -> depthwise Conv 3x3 (32) -> BatchNormalization -> Relu -> Conv 1x1 (16)."""
    rng = np.random.default_rng(13)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], group=32),
             helper.make_node("BatchNormalization", ["c1", "g", "beta", "mu", "var"], ["n1"]),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"])]
    inits = [_float("w1", rng.standard_normal((32, 1, 3, 3)) / 3),
             _float("g", 0.5 + rng.random(32)), _float("beta", rng.standard_normal(32) * 0.1),
             _float("mu", rng.standard_normal(32) * 0.1), _float("var", 0.5 + rng.random(32)),
             _float("w2", rng.standard_normal((16, 32, 1, 1)) / 6), _float("b2", rng.random(16))]
    return _save(path, nodes, inits, [1, 32, 10, 10], [1, 16, 10, 10])
