"""The numpy op set against onnxruntime, one single-node model per case, across opsets."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper
from onnx_support import ort_run

from tunecache.compiler.executor import Executor
from tunecache.compiler.frontend import load_graph
from tunecache.compiler.onnx_ops import ONNX_DTYPES

RNG = np.random.default_rng(7)
NP_TO_ONNX = {v: k for k, v in ONNX_DTYPES.items()}


def f32(*shape: int, positive: bool = False) -> np.ndarray:
    x = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(x) + np.float32(0.1) if positive else x


def i64(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


class Case:
    """A single-node model: ``feeds`` become graph inputs, ``consts`` initializers (in the
    node's input order given by ``order``; ``""`` for an omitted optional input)."""

    def __init__(self, op: str, opset: int, order: list[str], feeds: dict[str, np.ndarray],
                 consts: dict[str, np.ndarray] | None = None, outputs: int = 1,
                 id: str = "", **attrs: Any) -> None:
        self.op, self.opset, self.order = op, opset, order
        self.feeds, self.consts = feeds, consts or {}
        self.outputs, self.attrs = outputs, attrs
        self.id = id or f"{op}-{opset}"

    def model(self) -> Any:
        outs = [f"y{i}" for i in range(self.outputs)]
        node = helper.make_node(self.op, self.order, outs, name="the_node", **self.attrs)
        inputs = [helper.make_tensor_value_info(k, NP_TO_ONNX[v.dtype], list(v.shape))
                  for k, v in self.feeds.items()]
        inits = [numpy_helper.from_array(v, k) for k, v in self.consts.items()]
        # Output types are left to inference (onnxruntime needs only the names).
        graph = helper.make_graph([node], "case", inputs,
                                  [helper.make_empty_tensor_value_info(o) for o in outs], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                 ir_version=8)


X4 = f32(2, 3, 7, 6)
X3 = f32(2, 5, 4)

CASES = [
    *[Case(op, 13, ["x"], {"x": X3}) for op in
      ("Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Neg", "Abs", "Floor", "Ceil", "Identity")],
    Case("Sqrt", 13, ["x"], {"x": f32(3, 4, positive=True)}),
    Case("Log", 13, ["x"], {"x": f32(3, 4, positive=True)}),
    Case("Reciprocal", 13, ["x"], {"x": f32(3, 4, positive=True)}),
    Case("Add", 13, ["a", "b"], {"a": X3, "b": f32(5, 1)}),
    Case("Sub", 9, ["a", "b"], {"a": X3, "b": f32(4)}),
    Case("Mul", 13, ["a", "b"], {"a": f32(1, 5, 1), "b": X3}),
    Case("Div", 13, ["a", "b"], {"a": X3, "b": f32(2, 5, 4, positive=True)}),
    Case("Div", 13, ["a", "b"], {"a": i64(7, -7, 9), "b": i64(2, 2, -4)}, id="Div-int"),
    Case("Pow", 13, ["a", "b"], {"a": f32(3, 4, positive=True)}, {"b": np.float32(1.7)}),
    Case("Pow", 13, ["a", "b"], {"a": f32(3, 4)}, {"b": np.int64(2)}, id="Pow-int-exp"),
    Case("Sum", 13, ["a", "b", "c"], {"a": X3, "b": f32(4), "c": f32(2, 1, 4)}),
    Case("Max", 13, ["a", "b"], {"a": X3, "b": f32(4)}),
    Case("Min", 13, ["a", "b"], {"a": X3, "b": f32(4)}),
    Case("Mean", 13, ["a", "b"], {"a": X3, "b": f32(4)}),
    Case("LeakyRelu", 13, ["x"], {"x": X3}, alpha=0.2),
    Case("HardSigmoid", 13, ["x"], {"x": X3 * 4}),
    Case("HardSwish", 14, ["x"], {"x": X3 * 4}),
    Case("Gelu", 20, ["x"], {"x": X3}),
    Case("Gelu", 20, ["x"], {"x": X3}, approximate="tanh", id="Gelu-tanh"),
    Case("Clip", 9, ["x"], {"x": X3}, min=-0.5, max=0.7),
    Case("Clip", 13, ["x", "lo", "hi"], {"x": X3}, {"lo": np.float32(-0.5), "hi": np.float32(0.7)}),
    Case("Clip", 13, ["x", "lo"], {"x": X3}, {"lo": np.float32(0.0)}, id="Clip-13-min-only"),
    Case("Clip", 13, ["x", "", "hi"], {"x": X3}, {"hi": np.float32(0.1)}, id="Clip-13-max-only"),
    Case("Where", 13, ["c", "a", "b"], {"c": X3 > 0, "a": X3, "b": f32(4)}),
    Case("Equal", 13, ["a", "b"], {"a": i64(1, 2, 3), "b": i64(1, 0, 3)}),
    Case("Cast", 13, ["x"], {"x": X3 * 3}, to=TensorProto.INT64),
    Case("Cast", 9, ["x"], {"x": i64(1, -2, 3)}, to=TensorProto.FLOAT, id="Cast-9-float"),
    Case("BatchNormalization", 9, ["x", "s", "b", "m", "v"], {"x": X4},
         {"s": f32(3), "b": f32(3), "m": f32(3), "v": f32(3, positive=True)}, epsilon=1e-3),
    Case("BatchNormalization", 15, ["x", "s", "b", "m", "v"], {"x": f32(4, 3)},
         {"s": f32(3), "b": f32(3), "m": f32(3), "v": f32(3, positive=True)}),
    Case("MaxPool", 9, ["x"], {"x": X4}, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    Case("MaxPool", 12, ["x"], {"x": X4}, kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1,
         id="MaxPool-ceil"),
    Case("MaxPool", 12, ["x"], {"x": X4}, kernel_shape=[2, 2], dilations=[2, 1], id="MaxPool-dil"),
    Case("MaxPool", 11, ["x"], {"x": X4}, kernel_shape=[3, 3], strides=[2, 2],
         auto_pad="SAME_UPPER", id="MaxPool-same-upper"),
    Case("MaxPool", 11, ["x"], {"x": X4}, kernel_shape=[2, 2], strides=[1, 1],
         auto_pad="SAME_LOWER", id="MaxPool-same-lower"),
    Case("MaxPool", 13, ["x"], {"x": X3}, kernel_shape=[2], strides=[2], id="MaxPool-1d"),
    Case("AveragePool", 11, ["x"], {"x": X4}, kernel_shape=[3, 3], strides=[2, 2],
         pads=[1, 1, 1, 1], id="AveragePool-exclude-pad"),
    Case("AveragePool", 11, ["x"], {"x": X4}, kernel_shape=[3, 3], strides=[2, 2],
         pads=[1, 0, 1, 0], count_include_pad=1, id="AveragePool-include-pad"),
    Case("AveragePool", 11, ["x"], {"x": X4}, kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1,
         id="AveragePool-ceil"),
    Case("GlobalAveragePool", 9, ["x"], {"x": X4}),
    Case("GlobalMaxPool", 13, ["x"], {"x": X4}),
    Case("LRN", 9, ["x"], {"x": X4}, size=3, alpha=1e-3, beta=0.75, bias=2.0),
    Case("Concat", 13, ["a", "b"], {"a": X3, "b": f32(2, 2, 4)}, axis=1),
    Case("Concat", 11, ["a", "b"], {"a": X3, "b": f32(2, 5, 3)}, axis=-1, id="Concat-neg"),
    Case("Reshape", 13, ["x", "s"], {"x": X3}, {"s": i64(0, -1, 2)}),
    Case("Reshape", 13, ["x", "s"], {"x": X3, "s": i64(4, 0, 2)}, id="Reshape-runtime-shape"),
    Case("Flatten", 9, ["x"], {"x": X4}, axis=2),
    Case("Flatten", 13, ["x"], {"x": X4}, axis=0, id="Flatten-0"),
    Case("Transpose", 13, ["x"], {"x": X4}, perm=[0, 2, 3, 1]),
    Case("Transpose", 9, ["x"], {"x": X3}, id="Transpose-default"),
    Case("Softmax", 11, ["x"], {"x": X4}, axis=1, id="Softmax-11-coerced"),
    Case("Softmax", 13, ["x"], {"x": X4}, axis=1),
    Case("Softmax", 13, ["x"], {"x": X4}, id="Softmax-13-default"),
    Case("LogSoftmax", 13, ["x"], {"x": X3}),
    Case("Gather", 13, ["x", "i"], {"x": X3}, {"i": i64(-1, 0, 2)}, axis=1),
    Case("Gather", 13, ["x", "i"], {"x": f32(10, 4), "i": np.array([[1, 9], [0, 3]], np.int64)},
         id="Gather-embedding"),
    Case("Shape", 13, ["x"], {"x": X4}),
    Case("Shape", 15, ["x"], {"x": X4}, start=1, end=-1, id="Shape-15-slice"),
    Case("Size", 13, ["x"], {"x": X4}),
    Case("Unsqueeze", 11, ["x"], {"x": X3}, axes=[0, -1]),
    Case("Unsqueeze", 13, ["x", "a"], {"x": X3}, {"a": i64(1, -1)}),
    Case("Squeeze", 11, ["x"], {"x": f32(1, 3, 1, 2)}, axes=[-2]),
    Case("Squeeze", 13, ["x", "a"], {"x": f32(1, 3, 1, 2)}, {"a": i64(0)}),
    Case("Squeeze", 13, ["x"], {"x": f32(1, 3, 1, 2)}, id="Squeeze-13-all"),
    Case("Slice", 9, ["x"], {"x": X4}, starts=[1, -3], ends=[100, -1], axes=[2, 3]),
    Case("Slice", 13, ["x", "s", "e", "a", "st"], {"x": X4},
         {"s": i64(-1, 0), "e": i64(-(2**63), 6), "a": i64(2, -1), "st": i64(-2, 2)},
         id="Slice-13-steps"),
    Case("Slice", 11, ["x", "s", "e"], {"x": X3}, {"s": i64(1), "e": i64(2**63 - 1)},
         id="Slice-11-default-axes"),
    Case("ConstantOfShape", 13, ["s"], {"s": i64(2, 3)},
         value=numpy_helper.from_array(np.array([1.5], np.float32))),
    Case("ConstantOfShape", 9, ["s"], {"s": i64(4)}, id="ConstantOfShape-default"),
    Case("Constant", 13, [], {}, value=numpy_helper.from_array(f32(2, 3))),
    Case("Constant", 13, [], {}, value_ints=[1, 2], id="Constant-ints"),
    Case("ReduceMean", 13, ["x"], {"x": X4}, axes=[1, -1], keepdims=0),
    Case("ReduceMean", 18, ["x", "a"], {"x": X4}, {"a": i64(2)}),
    Case("ReduceMean", 13, ["x"], {"x": X4}, id="ReduceMean-all"),
    Case("ReduceSum", 13, ["x", "a"], {"x": X4}, {"a": i64(0, 3)}),
    Case("ReduceMax", 13, ["x"], {"x": X4}, axes=[1]),
    Case("ArgMax", 13, ["x"], {"x": X3}, axis=1, keepdims=0),
    Case("LayerNormalization", 17, ["x", "s", "b"], {"x": X4}, {"s": f32(7, 6), "b": f32(6)},
         axis=-2, epsilon=1e-3),
    Case("LayerNormalization", 17, ["x", "s"], {"x": X3}, {"s": f32(4)}, id="LayerNorm-no-bias"),
    Case("Dropout", 9, ["x"], {"x": X3}, ratio=0.5),
    Case("Dropout", 13, ["x", "r"], {"x": X3}, {"r": np.float32(0.2)}, outputs=2,
         id="Dropout-13-mask"),
    Case("Expand", 13, ["x", "s"], {"x": f32(3, 1)}, {"s": i64(2, 1, 4)}),
    Case("Tile", 13, ["x", "r"], {"x": f32(2, 3)}, {"r": i64(2, 1)}),
    Case("Pad", 9, ["x"], {"x": X4}, pads=[0, 0, 1, 2, 0, 0, 2, 1], value=0.5),
    Case("Pad", 13, ["x", "p"], {"x": X4}, {"p": i64(0, 0, 2, 1, 0, 0, 1, 2)}, mode="reflect",
         id="Pad-13-reflect"),
    Case("Pad", 13, ["x", "p"], {"x": X4}, {"p": i64(0, 0, -1, 1, 0, 0, 1, -2)}, mode="edge",
         id="Pad-13-negative-edge"),
    Case("Pad", 18, ["x", "p", "v", "a"], {"x": X4},
         {"p": i64(1, 2, 0, 1), "v": np.float32(-1), "a": i64(-1, 1)}, id="Pad-18-axes"),
    Case("Split", 13, ["x", "s"], {"x": X3}, {"s": i64(2, 3)}, outputs=2, axis=1),
    Case("Split", 11, ["x"], {"x": X3}, outputs=2, axis=-1, id="Split-11-even"),
    Case("Split", 18, ["x"], {"x": X3}, outputs=3, axis=1, num_outputs=3, id="Split-18-uneven"),
    Case("Range", 13, ["a", "b", "c"], {}, {"a": np.int64(1), "b": np.int64(10),
                                            "c": np.int64(3)}),
    Case("MatMul", 13, ["a", "b"], {"a": f32(2, 1, 3, 4), "b": f32(1, 3, 4, 5)},
         id="MatMul-broadcast-fallback"),
    Case("Gemm", 13, ["a", "b", "c"], {"a": f32(3, 4), "b": f32(4, 5), "c": f32(3, 5)},
         alpha=0.5, beta=0.25, id="Gemm-fallback"),
    Case("Conv", 13, ["x", "w", "b"], {"x": X3}, {"w": f32(6, 5, 3), "b": f32(6)},
         pads=[1, 0], strides=[2], id="Conv-1d"),
    Case("Conv", 13, ["x", "w"], {"x": X4, "w": f32(6, 1, 3, 2)}, group=3, dilations=[2, 1],
         pads=[2, 0, 1, 1], id="Conv-runtime-weights"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_matches_onnxruntime(case: Case) -> None:
    model = case.model()
    expected = ort_run(model, case.feeds)
    got = Executor(load_graph(model)).run(case.feeds)
    assert len(got) == len(expected)
    for (name, actual), want in zip(got.items(), expected, strict=True):
        assert actual.shape == want.shape, (name, actual.shape, want.shape)
        assert actual.dtype == want.dtype, (name, actual.dtype, want.dtype)
        np.testing.assert_allclose(actual, want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_every_listed_op_has_a_case() -> None:
    """The issue's op list (and the kernel ops' fallbacks) are all covered above."""
    required = {
        "Relu", "Add", "Sum", "Mul", "Sub", "Div", "Sqrt", "Pow", "Erf", "Tanh", "Sigmoid",
        "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool", "LRN", "Concat",
        "Reshape", "Flatten", "Transpose", "Softmax", "Gather", "Shape", "Unsqueeze", "Squeeze",
        "Slice", "Cast", "Constant", "ConstantOfShape", "ReduceMean", "LayerNormalization",
        "Dropout", "Identity", "MatMul", "Gemm", "Conv", "Clip",
    }
    assert required <= {c.op for c in CASES}


def test_float32_erf_is_accurate_everywhere() -> None:
    from scipy.special import erf

    from tunecache.compiler.onnx_ops.elementwise import _erf

    x = np.concatenate([np.linspace(-6, 6, 200_001), [0.0, -0.0, 1e-30, 40.0, -40.0, np.inf,
                                                      -np.inf]]).astype(np.float32)
    got = _erf(x)
    assert got.dtype == np.float32
    assert np.abs(got.astype(np.float64) - erf(x.astype(np.float64))).max() < 1e-6
    assert np.array_equal(np.signbit(got), np.signbit(x))
    assert np.isnan(_erf(np.array([np.nan], np.float32)))[0]


@pytest.mark.parametrize(("opset", "bounds"), [(13, ("lo", "")), (13, ("", "hi")), (9, ())])
def test_clip_without_a_bound_clamps_infinity_to_the_largest_float(
        opset: int, bounds: tuple[str, ...]) -> None:
    """An omitted Clip bound is float32's lowest / largest finite value, as onnxruntime
    computes it: +-inf come out as -+3.4e38 (found by tests/test_fuzz_onnxruntime.py)."""
    x = np.array([np.inf, -np.inf, np.nan, 1.0, -2.0], np.float32)
    consts = {name: np.float32(v) for name, v in (("lo", -1.0), ("hi", 0.5)) if name in bounds}
    attrs = {} if opset >= 11 else {"min": -1.0}
    model = Case("Clip", opset, ["x", *bounds], {"x": x}, consts, **attrs).model()
    got = Executor(load_graph(model)).run({"x": x})["y0"]
    np.testing.assert_array_equal(got, ort_run(model, {"x": x})[0])
    assert np.isfinite(got[:2]).all()
