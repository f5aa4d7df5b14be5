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

__all__ = ["SCOPE", "has_reference", "reference_call", "reference_function"]

SCOPE = "tunecache.scope"
"""The attribute under which a node with subgraphs (If, Loop, Scan) keeps the names its
subgraphs read from the enclosing graph, in the order they follow its own inputs
(``onnx_nodes.with_scope`` sets it)."""

NodeFunction = Callable[[Sequence["np.ndarray | None"]], list[np.ndarray]]


@cache
def has_reference(op_type: str, opset: int) -> bool:
    """Whether ``onnx.reference`` implements default-domain ``op_type`` at ``opset`` (a
    kernel of its own, or the body of a function op) for a node of tensors (not sequences
    or optionals)."""
    import onnx
    from onnx.reference.ops import load_op

    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
        if not schema.has_function:  # type: ignore[attr-defined]  # the evaluator runs its body
            load_op("", op_type, opset)
    except Exception:  # onnx raises a bare RuntimeError / ValueError for unknown ops
        return False
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    return all(any(t.startswith("tensor(") for t in allowed.get(p.type_str, [p.type_str]))
               for p in (*schema.inputs, *schema.outputs))


def _attribute(onnx: Any, value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return onnx.numpy_helper.from_array(value)
    return value


def _full_sequences(values: Sequence[np.ndarray | None], attrs: Mapping[str, Any]
                    ) -> str | None:
    """A recurrent node's ``sequence_lens`` (input 4), which the reference ignores: refused
    at run time unless every length is the whole sequence."""
    x, lengths = values[0], values[4] if len(values) > 4 else None
    if x is None or lengths is None:
        return None
    seq = x.shape[1 if int(attrs.get("layout", 0)) else 0]
    if (np.asarray(lengths) == seq).all():
        return None
    return (f"sequence_lens {np.asarray(lengths).tolist()} shorter than the sequence ({seq}) "
            "is not supported (ONNX's reference implementation ignores it)")


REFERENCE_GUARDS: dict[str, Callable[[Sequence[np.ndarray | None], Mapping[str, Any]],
                                     str | None]] = {
    "LSTM": _full_sequences, "GRU": _full_sequences, "RNN": _full_sequences}
"""Checks before the reference runs a node, by op type: why its answer would be wrong for
these inputs (raised as the node's failure), or None."""


def reference_function(op_type: str, inputs: Sequence[str], outputs: Sequence[str],
                       attrs: Mapping[str, Any], opset: int) -> NodeFunction:
    """The node ``op_type(inputs) -> outputs`` with ``attrs``, run by ``onnx.reference``;
    called with the input arrays (None for an omitted optional one) in the node's order,
    it returns the outputs in the node's order. A node with subgraphs lists what they read
    from the enclosing graph under :data:`SCOPE`, after its own inputs: those values reach
    the subgraphs under their names."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    scope = tuple(attrs.get(SCOPE, ()))
    own = len(inputs) - len(scope)
    # Names of their own: the graph's may be empty (an omitted optional input or output).
    ins = [f"tc.i{k}" if name else "" for k, name in enumerate(inputs[:own])] + list(scope)
    outs = [f"tc.o{k}" if name else "" for k, name in enumerate(outputs)]
    node = onnx.helper.make_node(op_type, ins[:own], outs, **{
        k: _attribute(onnx, v) for k, v in attrs.items() if k != SCOPE})
    nested = any(isinstance(v, onnx.GraphProto) for v in attrs.values())
    if nested:  # a model: its subgraphs find the outer names and the opset in its scope
        untyped = onnx.TypeProto()
        node = onnx.helper.make_model(onnx.helper.make_graph(
            [node], op_type, [onnx.helper.make_value_info(n, untyped) for n in ins if n],
            [onnx.helper.make_value_info(o, untyped) for o in outs if o]),
            opset_imports=[onnx.helper.make_opsetid("", opset)])
    evaluator = (ReferenceEvaluator(node, new_ops=[_loop_class(), *_numpy_classes(opset)])
                 if nested else ReferenceEvaluator(node, opsets={"": opset}))
    wanted = [o for o in outs if o]

    guard = REFERENCE_GUARDS.get(op_type)

    def run(values: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        if guard is not None and (problem := guard(values, attrs)):
            raise ValueError(problem)
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
    present = tuple(v is not None for v in values)
    plain = tuple(sorted(attrs.items()))
    try:
        hash(plain)
    except TypeError:  # a tensor attribute: built for this call alone
        return _called.__wrapped__(op_type, present, plain, opset, outputs)(values)
    return _called(op_type, present, plain, opset, outputs)(values)


@cache
def _called(op_type: str, present: tuple[bool, ...], attrs: tuple[tuple[str, Any], ...],
            opset: int, outputs: int) -> NodeFunction:
    """:func:`reference_function` built once per op, inputs given and (plain) attributes:
    a numpy op that meets a float8 tensor on every run does not rebuild it every run."""
    names = [f"x{k}" if given else "" for k, given in enumerate(present)]
    return reference_function(op_type, names, [f"y{k}" for k in range(outputs)], dict(attrs),
                              opset)


@cache
def _numpy_classes(opset: int) -> tuple[type, ...]:
    """The numpy implementations of :data:`~.registry.SUBGRAPH_OPS` as onnx.reference op
    classes, so that a subgraph's evaluator runs them instead of its own."""
    from onnx.reference.op_run import OpRun

    from tunecache.compiler.onnx_ops.registry import OPS, SUBGRAPH_OPS

    def numpy_class(op_type: str) -> type:
        impl = OPS[op_type]

        def _run(self: Any, *inputs: np.ndarray | None, **attrs: Any) -> tuple[np.ndarray, ...]:
            return tuple(impl(list(inputs), attrs, opset))
        return type(op_type, (OpRun,), {"op_domain": "", "_run": _run})
    return tuple(numpy_class(op) for op in sorted(SUBGRAPH_OPS))


@cache
def _loop_class() -> type:
    """onnx.reference's Loop with scalar scan outputs stacked as ONNX says: one value per
    iteration, shape ``[iterations]`` (it stacks them with ``vstack``: ``[iterations, 1]``,
    a wrong shape where onnxruntime gives the right one)."""
    from onnx.reference.ops.op_loop import Loop as ReferenceLoop

    class Loop(ReferenceLoop):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.scalar_scans: list[bool] = []
            run_body: Any = getattr(self, "_run_body")  # noqa: B009  (set per instance)

            def watched(*a: Any, **kw: Any) -> Any:
                outputs = run_body(*a, **kw)
                if self.K:
                    self.scalar_scans = [np.ndim(o) == 0 for o in outputs[-self.K:]]
                return outputs
            self._run_body = watched

        def _run(self, *args: Any, **kwargs: Any) -> Any:
            self.scalar_scans = []
            outputs = list(super()._run(*args, **kwargs))
            for k, scalar in enumerate(self.scalar_scans):
                if scalar:
                    outputs[self.N + k] = outputs[self.N + k].reshape(-1)
            return tuple(outputs)
    return Loop
