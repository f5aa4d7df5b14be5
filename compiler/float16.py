"""float16 models computed in float32.

A model whose tensors are float16 (exported with ``half()``, or converted by
``onnxconverter_common.float16``) is read as the same graph in float32: its float16
initializers, constants and casts become float32 ones, each float16 input is cast to float32
once where the graph starts and each float16 output back where it ends. Its Conv, MatMul and
Gemm then run as the float32 kernels every other model runs, instead of as numpy in float16
(57-120x slower than onnxruntime on an fp16 ResNet, issue 53); its interface (float16 in,
float16 out) stays as declared. The results are the float32 computation's rounded to float16
at the end, at least as close to the exact values as a float16 computation's.
"""

from __future__ import annotations

from typing import Any

__all__ = ["holds_float16", "widen_float16"]

FLOAT, FLOAT16 = 1, 10
"""``TensorProto.FLOAT`` and ``TensorProto.FLOAT16``."""
_SUFFIX = "/float32"


def widen_float16(onnx: Any, model: Any, base_dir: str) -> bool:
    """Rewrite ``model`` (a ModelProto, in place) to compute in float32 wherever it holds
    float16; returns whether it held any. ``base_dir`` is where external data is read."""
    graph = model.graph
    if not holds_float16(graph):
        return False
    for init in graph.initializer:
        if init.data_type == FLOAT16:
            array = onnx.numpy_helper.to_array(init, base_dir=base_dir).astype("float32")
            init.CopyFrom(onnx.numpy_helper.from_array(array, init.name))
    for node in graph.node:
        _widen_node(onnx, node)
    for info in graph.value_info:
        if info.type.tensor_type.elem_type == FLOAT16:
            info.type.tensor_type.elem_type = FLOAT
    _cast_inputs(onnx, graph)
    _cast_outputs(onnx, graph)
    return True


def holds_float16(graph: Any) -> bool:
    """Whether a GraphProto has float16 tensors, inputs, outputs or casts."""
    typed = [*graph.input, *graph.output, *graph.value_info]
    return (any(i.data_type == FLOAT16 for i in graph.initializer)
            or any(v.type.tensor_type.elem_type == FLOAT16 for v in typed)
            or any(a.name in ("to", "dtype") and a.i == FLOAT16
                   for n in graph.node for a in n.attribute))


def _widen_node(onnx: Any, node: Any) -> None:
    """A node's float16 attributes as float32: cast targets, dtypes, constant values."""
    for attr in node.attribute:
        if attr.name in ("to", "dtype") and attr.i == FLOAT16:
            attr.i = FLOAT
        elif attr.HasField("t") and attr.t.data_type == FLOAT16:
            array = onnx.numpy_helper.to_array(attr.t).astype("float32")
            attr.t.CopyFrom(onnx.numpy_helper.from_array(array, attr.t.name))


def _rename_inputs(graph: Any, old: str, new: str) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new


def _cast_inputs(onnx: Any, graph: Any) -> None:
    """Each float16 graph input cast to float32 by a first node the rest reads."""
    casts = []
    for info in graph.input:
        if info.type.tensor_type.elem_type != FLOAT16:
            continue
        _rename_inputs(graph, info.name, info.name + _SUFFIX)
        casts.append(onnx.helper.make_node("Cast", [info.name], [info.name + _SUFFIX],
                                           name=f"{info.name}{_SUFFIX}/cast", to=FLOAT))
    for position, cast in enumerate(casts):
        graph.node.insert(position, cast)


def _cast_outputs(onnx: Any, graph: Any) -> None:
    """Each float16 graph output computed in float32 and cast back by a last node."""
    for info in graph.output:
        if info.type.tensor_type.elem_type != FLOAT16:
            continue
        wide = info.name + _SUFFIX
        for node in graph.node:
            for i, name in enumerate(node.output):
                if name == info.name:
                    node.output[i] = wide
        _rename_inputs(graph, info.name, wide)
        graph.node.append(onnx.helper.make_node("Cast", [wide], [info.name],
                                                name=f"{info.name}/cast", to=FLOAT16))
