"""Small ONNX graphs onnxruntime refuses, one defect each (:data:`DEFECTS`): the invalid half of
the differential fuzzing (``graph_fuzz.py``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from graph_fuzz import DIMS, F32, I64, OPSET, FuzzCase
from hypothesis import strategies as st
from onnx import helper, numpy_helper

# -- invalid graphs ---------------------------------------------------------------------------

_Tensor = tuple[str, int, Sequence[int]]


def _model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[_Tensor],
           outputs: Sequence[str], inits: Mapping[str, np.ndarray], opset: int = OPSET,
           ir_version: int = 8) -> onnx.ModelProto:
    """A model made with onnx.helper and never checked: the defect must reach the readers."""
    graph = helper.make_graph(
        list(nodes), "invalid", [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in inputs],
        [helper.make_tensor_value_info(o, F32, None) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=ir_version)


def _mk(op: str, inputs: Sequence[str], outputs: Sequence[str], **attrs: Any) -> onnx.NodeProto:
    return helper.make_node(op, list(inputs), list(outputs), **attrs)


def _w(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return np.linspace(-1, 1, math.prod(shape), dtype=np.float64).astype(dtype).reshape(shape)


_Defect = Callable[[int, int], tuple[list[onnx.NodeProto], dict[str, np.ndarray], dict[str, Any]]]
"""``(a, b)`` two small dims -> nodes reading ``x`` [a, b] and writing ``y``, initializers,
and model overrides (``inputs``, ``outputs``, ``opset``, ``ir_version``)."""


def _two_writers(a: int, b: int) -> Any:
    return [_mk("Relu", ["x"], ["y"]), _mk("Sigmoid", ["x"], ["y"])], {}, {}


def _writes_initializer(a: int, b: int) -> Any:
    return [_mk("Relu", ["x"], ["w"]), _mk("Add", ["w", "x"], ["y"])], {"w": _w(a, b)}, {}


def _no_outputs(a: int, b: int) -> Any:
    return [_mk("Relu", ["x"], ["y"])], {}, {"outputs": []}


def _matmul_inner(a: int, b: int) -> Any:
    return [_mk("MatMul", ["x", "w"], ["y"])], {"w": _w(b + 1, 3)}, {}


def _matmul_f64(a: int, b: int) -> Any:
    return [_mk("MatMul", ["x", "w"], ["y"])], {"w": _w(b, 3, dtype=np.float64)}, {}


def _reshape_two_unknown(a: int, b: int) -> Any:
    return [_mk("Reshape", ["x", "s"], ["y"])], {"s": np.array([-1, -1], np.int64)}, {}


def _split_beyond(a: int, b: int) -> Any:
    nodes = [_mk("Split", ["x", "s"], ["y", "z"], axis=1)]
    return nodes, {"s": np.array([b, 2], np.int64)}, {"outputs": ["y", "z"]}


def _opset_99(a: int, b: int) -> Any:
    return [_mk("Relu", ["x"], ["y"])], {}, {"opset": 99}


def _ir_99(a: int, b: int) -> Any:
    return [_mk("Relu", ["x"], ["y"])], {}, {"ir_version": 99}


def _dangling(a: int, b: int) -> Any:
    return [_mk("Add", ["x", "ghost"], ["y"])], {}, {}


def _undefined_output(a: int, b: int) -> Any:
    return [_mk("Relu", ["x"], ["y"])], {}, {"outputs": ["y", "nowhere"]}


def _unknown_op(a: int, b: int) -> Any:
    return [_mk("Frobnicate", ["x"], ["y"])], {}, {}


def _add_mismatch(a: int, b: int) -> Any:
    return [_mk("Add", ["x", "w"], ["y"])], {"w": _w(b + 1)}, {}


def _concat_mismatch(a: int, b: int) -> Any:
    return [_mk("Concat", ["x", "w"], ["y"], axis=0)], {"w": _w(2, b + 1)}, {}


def _concat_no_axis(a: int, b: int) -> Any:
    return [_mk("Concat", ["x", "x"], ["y"])], {}, {}


def _transpose_perm(a: int, b: int) -> Any:
    return [_mk("Transpose", ["x"], ["y"], perm=[0, 0])], {}, {}


def _softmax_axis(a: int, b: int) -> Any:
    return [_mk("Softmax", ["x"], ["y"], axis=2)], {}, {}


def _extra_input(a: int, b: int) -> Any:
    return [_mk("Relu", ["x", "x"], ["y"])], {}, {}


def _missing_input(a: int, b: int) -> Any:
    return [_mk("MatMul", ["x"], ["y"])], {}, {}


def _cycle(a: int, b: int) -> Any:
    return [_mk("Add", ["x", "z"], ["y"]), _mk("Relu", ["y"], ["z"])], {}, {}


def _self_loop(a: int, b: int) -> Any:
    return [_mk("Add", ["x", "y"], ["y"])], {}, {}


def _shadow_input(a: int, b: int) -> Any:
    return [_mk("Relu", ["x"], ["x"]), _mk("Neg", ["x"], ["y"])], {}, {}


def _duplicate_input(a: int, b: int) -> Any:
    return [_mk("Relu", ["x"], ["y"])], {}, {"inputs": [("x", F32, (a, b)), ("x", F32, (a, b))]}


def _reshape_count(a: int, b: int) -> Any:
    return [_mk("Reshape", ["x", "s"], ["y"])], {"s": np.array([a * b + 1], np.int64)}, {}


def _gemm_c(a: int, b: int) -> Any:
    return [_mk("Gemm", ["x", "w", "c"], ["y"])], {"w": _w(b, 3), "c": _w(a + 1, 2)}, {}


def _sigmoid_int(a: int, b: int) -> Any:
    return [_mk("Sigmoid", ["x"], ["y"])], {}, {"inputs": [("x", I64, (a, b))]}


def _attr_type(a: int, b: int) -> Any:
    node = _mk("Softmax", ["x"], ["y"])
    node.attribute.append(helper.make_attribute("axis", 1.5))
    return [node], {}, {}


def _conv_channels(a: int, b: int) -> Any:
    nodes = [_mk("Conv", ["x", "w"], ["y"])]
    return nodes, {"w": _w(2, b + 1, 1, 1)}, {"inputs": [("x", F32, (1, b, a, a))]}


def _conv_groups(a: int, b: int) -> Any:
    nodes = [_mk("Conv", ["x", "w"], ["y"], group=3)]
    return nodes, {"w": _w(2, 1, 1, 1)}, {"inputs": [("x", F32, (1, 4, a, b))]}


def _conv_kernel_attr(a: int, b: int) -> Any:
    nodes = [_mk("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1])]
    return nodes, {"w": _w(2, 2, 3, 3)}, {"inputs": [("x", F32, (1, 2, a + 3, b + 3))]}


def _pool_big_kernel(a: int, b: int) -> Any:
    nodes = [_mk("MaxPool", ["x"], ["y"], kernel_shape=[a + 4, b + 4])]
    return nodes, {}, {"inputs": [("x", F32, (1, 1, a, b))]}


def _layernorm_scale(a: int, b: int) -> Any:
    return [_mk("LayerNormalization", ["x", "g"], ["y"])], {"g": _w(b + 1)}, {}


def _batchnorm_params(a: int, b: int) -> Any:
    params = {"g": _w(b), "bb": _w(b), "m": _w(b + 1), "v": _w(b) + 2}
    return [_mk("BatchNormalization", ["x", "g", "bb", "m", "v"], ["y"])], params, {}


DEFECTS: dict[str, _Defect] = {
    "two nodes write one output": _two_writers,
    "node output named like an initializer": _writes_initializer,
    "no graph outputs": _no_outputs,
    "MatMul inner dims differ": _matmul_inner,
    "float32 x float64 MatMul": _matmul_f64,
    "Reshape to [-1, -1]": _reshape_two_unknown,
    "Split sizes beyond the axis": _split_beyond,
    "opset 99": _opset_99,
    "IR version 99": _ir_99,
    "input nobody writes": _dangling,
    "graph output nobody writes": _undefined_output,
    "unknown op type": _unknown_op,
    "Add of shapes that do not broadcast": _add_mismatch,
    "Concat of mismatched shapes": _concat_mismatch,
    "Concat without its axis": _concat_no_axis,
    "Transpose perm repeats an axis": _transpose_perm,
    "Softmax axis out of range": _softmax_axis,
    "Relu with two inputs": _extra_input,
    "MatMul with one input": _missing_input,
    "cycle": _cycle,
    "node reads its own output": _self_loop,
    "node output named like the graph input": _shadow_input,
    "graph input declared twice": _duplicate_input,
    "Reshape to another element count": _reshape_count,
    "Gemm C that does not broadcast": _gemm_c,
    "Sigmoid of int64": _sigmoid_int,
    "float Softmax axis": _attr_type,
    "Conv weight channels differ": _conv_channels,
    "Conv group does not divide channels": _conv_groups,
    "Conv kernel_shape contradicts the weight": _conv_kernel_attr,
    "MaxPool kernel larger than the input": _pool_big_kernel,
    "LayerNormalization scale of the wrong size": _layernorm_scale,
    "BatchNormalization mean of the wrong size": _batchnorm_params,
}
"""Defects onnxruntime refuses when it creates the session (or at the latest, runs it)."""


@st.composite
def invalid_cases(draw: st.DrawFn) -> FuzzCase:
    """A small graph with one defect from :data:`DEFECTS`, on an input ``x`` of
    vocabulary dims (made without onnx.checker, which would stop some of them first)."""
    name = draw(st.sampled_from(sorted(DEFECTS)))
    a, b = draw(st.sampled_from(DIMS[1:])), draw(st.sampled_from(DIMS[1:]))
    nodes, inits, extra = DEFECTS[name](a, b)
    inputs = extra.get("inputs", [("x", F32, (a, b))])
    model = _model(nodes, inputs, extra.get("outputs", ["y"]), inits,
                   opset=extra.get("opset", OPSET), ir_version=extra.get("ir_version", 8))
    rng = np.random.default_rng(a * 31 + b)
    feeds = {n: (rng.standard_normal(tuple(s)) * 3).astype(np.float32 if t == F32 else np.int64)
             for n, t, s in dict.fromkeys(inputs)}
    return FuzzCase(model, feeds, False, [f"{name} (x {[list(s) for _, _, s in inputs]})"])


