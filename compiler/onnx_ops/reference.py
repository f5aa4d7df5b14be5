"""ONNX's own reference implementation (``onnx.reference``) for the ops with no numpy code here.

The executor runs most non-kernel nodes with tunecache's numpy implementations
(:data:`~tunecache.compiler.onnx_ops.registry.OPS`). The rest of the standard operator set
(Resize, TopK, NonMaxSuppression, LSTM, Einsum, ScatterND, …) would otherwise be refused;
:func:`has_reference` says whether the ``onnx`` package implements one, and
:func:`reference_function` builds, once per node, the function that runs it. These nodes
are correct but slow (Python, often per element): the program's profile marks them
``reference`` (:data:`~tunecache.compiler.native.profile.WHERE`) so no model spends time
there without saying so.

The node is rebuilt from the reader's plain attribute values (tensors back to
``TensorProto``, subgraphs kept as they were read), so what runs is exactly the model's node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

import numpy as np

__all__ = ["has_reference", "reference_call", "reference_function"]

NodeFunction = Callable[[Sequence["np.ndarray | None"]], list[np.ndarray]]


@cache
def has_reference(op_type: str, opset: int) -> bool:
    """Whether ``onnx.reference`` implements default-domain ``op_type`` at ``opset`` for a
    node of tensors alone (not sequences or optionals, no subgraph: a node that reads outer
    names through a subgraph needs the whole graph's scope)."""
    import onnx
    from onnx.reference.ops import load_op

    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
        if not schema.has_function:  # type: ignore[attr-defined]  # the evaluator runs its body
            load_op("", op_type, opset)
    except Exception:  # onnx raises a bare RuntimeError / ValueError for unknown ops
        return False
    graphs = (onnx.defs.OpSchema.AttrType.GRAPH, onnx.defs.OpSchema.AttrType.GRAPHS)
    if any(a.type in graphs for a in schema.attributes.values()):
        return False
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    return all(any(t.startswith("tensor(") for t in allowed.get(p.type_str, [p.type_str]))
               for p in (*schema.inputs, *schema.outputs))


def _attribute(onnx: Any, value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return onnx.numpy_helper.from_array(value)
    return value


def reference_function(op_type: str, inputs: Sequence[str], outputs: Sequence[str],
                       attrs: Mapping[str, Any], opset: int) -> NodeFunction:
    """The node ``op_type(inputs) -> outputs`` with ``attrs``, run by ``onnx.reference``;
    called with the input arrays (None for an omitted optional one) in the node's order,
    it returns the outputs in the node's order."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    # Names of their own: the graph's may be empty (an omitted optional input or output).
    ins = [f"i{k}" if name else "" for k, name in enumerate(inputs)]
    outs = [f"o{k}" if name else "" for k, name in enumerate(outputs)]
    node = onnx.helper.make_node(op_type, ins, outs,
                                 **{k: _attribute(onnx, v) for k, v in attrs.items()})
    evaluator = ReferenceEvaluator(node, opsets={"": opset})
    wanted = [o for o in outs if o]

    def run(values: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        feeds = {name: value for name, value in zip(ins, values, strict=False)
                 if name and value is not None}
        results = dict(zip(wanted, evaluator.run(wanted, feeds), strict=True))
        return [_tensor(results[o]) if o else np.empty(0, np.float32) for o in outs]
    return run


def _tensor(value: Any) -> np.ndarray:
    out = np.asarray(value)
    # ONNX strings are numpy objects (numpy_helper's convention); some ops answer in str_.
    return out.astype(object) if out.dtype.kind == "U" else out


def reference_call(op_type: str, values: Sequence[np.ndarray | None],
                   attrs: Mapping[str, Any], opset: int, outputs: int = 1) -> list[np.ndarray]:
    """One run of ``op_type`` on ``values`` by the reference implementation: for a numpy
    implementation that meets, at run time, a type it leaves to ONNX's (a float8 or int4
    tensor to dequantize, say)."""
    names = [f"x{k}" if v is not None else "" for k, v in enumerate(values)]
    return reference_function(op_type, names, [f"y{k}" for k in range(outputs)], attrs,
                              opset)(values)
