"""Run a loaded :class:`~tunecache.compiler.graph.Graph`: kernels for kernel nodes, numpy
for the rest.

An :class:`Executor` is built once per graph and set of kernels and then run many times. A
kernel node calls the kernel given for it (a generated kernel from
:func:`tunecache.compiler.runtime.compile_kernel`, or any callable with the same contract)
or, when none is given, :func:`numpy_kernel` of its op. Kernel arguments are the node's
tensors reshaped to ``op.arguments()`` shapes and element types, C-contiguous (constants are
prepared once, at construction; constant weights — conv2d W, matmul B — are packed into the
kernel's layout once, when the kernel offers ``bind_weights``); the kernel's result is reshaped to the
node's ONNX output shape. Intermediate tensors are released after their last use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tunecache.compiler import onnx_ops
from tunecache.compiler.elements import argument_dtypes, decoded, output_dtype
from tunecache.compiler.graph import (
    Graph,
    KernelNode,
    ModelError,
    OnnxNode,
    TensorInfo,
)
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.ops import OpSignature

__all__ = ["Executor", "Kernel", "check_inputs", "numpy_kernel"]

Kernel = Callable[..., np.ndarray]
"""Called with the op's input arrays (``op.arguments()`` order, shapes and element types,
C-contiguous); returns the output array of the op's output shape."""

_Env = dict[str, Any]


def numpy_kernel(op: OpSignature) -> Kernel:
    """A numpy implementation of a kernel op: its kind's reference, returning the op's
    output element type."""
    reference = op_kind(op.kind).reference
    dtype = output_dtype(op)

    def run(*arrays: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(reference(op, decoded(op, arrays)), dtype=dtype)
    return run


class Executor:
    """Runs a graph; build once, call :meth:`run` many times.

    ``kernels`` maps :attr:`KernelNode.name` to a kernel; kernel nodes without one run
    :func:`numpy_kernel` of their op (the reference path).
    """

    def __init__(self, graph: Graph, kernels: Mapping[str, Kernel] | None = None) -> None:
        self.graph = graph
        kernels = dict(kernels or {})
        names = {node.name for node in graph.kernel_nodes}
        unknown = sorted(set(kernels) - names)
        if unknown:
            raise ModelError(f"kernels given for {', '.join(map(repr, unknown))}, which "
                             f"{'is' if len(unknown) == 1 else 'are'} not a kernel node of "
                             f"{graph.name!r}; its kernel nodes: {', '.join(sorted(names))}")
        self._constants = dict(graph.constants)
        self._outputs = {o.name for o in graph.outputs}
        self._steps: list[Callable[[_Env], None]] = []
        for step in graph.steps:
            if isinstance(step, KernelNode):
                self._steps.append(self._kernel_step(step, kernels.get(step.name)))
            else:
                self._steps.append(self._onnx_step(step))
        self._release = self._last_uses()

    # -- preparation ----------------------------------------------------------------------

    def _kernel_step(self, node: KernelNode, kernel: Kernel | None) -> Callable[[_Env], None]:
        fn = kernel if kernel is not None else numpy_kernel(node.op)
        shapes = [a.shape for a in node.op.arguments() if a.role == "input"]
        dtypes = argument_dtypes(node.op)
        # Constant arguments are reshaped and made contiguous once, here.
        fixed: list[np.ndarray | None] = []
        for name, shape, dtype in zip(node.inputs, shapes, dtypes, strict=True):
            value = self._constants.get(name)
            fixed.append(None if value is None else _argument(value, shape, dtype))
        plan = list(zip(node.inputs, shapes, dtypes, fixed, strict=True))
        if len(fixed) > 1 and fixed[1] is not None and getattr(fn, "prepacks_weights", False):
            # Constant weights (conv W, matmul B) go into the kernel's layout once, not per call.
            fn = fn.bind_weights(fixed[1])  # type: ignore[attr-defined]
            del plan[1]
        out_name, out_shape = node.output, node.output_shape
        label = f"kernel node {node.name!r} ({node.op.text})"

        def run(env: _Env) -> None:
            args = [f if f is not None else _argument(env[n], s, t) for n, s, t, f in plan]
            try:
                result = fn(*args)
            except Exception as exc:
                raise ModelError(f"{label} failed: {exc}") from exc
            env[out_name] = result.reshape(out_shape)
        return run

    def _onnx_step(self, node: OnnxNode) -> Callable[[_Env], None]:
        inputs, outputs = node.inputs, node.outputs
        fn = onnx_ops.node_function(node.op_type, inputs, outputs, node.attrs, self.graph.opset)
        label = f"node {node.name!r} ({node.op_type})"

        def run(env: _Env) -> None:
            try:
                values = fn([env[n] if n else None for n in inputs])
            except Exception as exc:
                raise ModelError(f"{label} failed: {type(exc).__name__}: {exc}") from exc
            for name, value in zip(outputs, values, strict=False):
                if name:
                    env[name] = value
        return run

    def _last_uses(self) -> list[tuple[str, ...]]:
        """Per step, the intermediate tensors no later step needs."""
        last: dict[str, int] = {}
        for index, step in enumerate(self.graph.steps):
            for name in step.inputs:
                if name:
                    last[name] = index
        release: list[list[str]] = [[] for _ in self.graph.steps]
        for name, index in last.items():
            if name not in self._constants and name not in self._outputs:
                release[index].append(name)
        return [tuple(r) for r in release]

    # -- running --------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """Run the graph; returns ``{output name: array}`` in the model's output order.

        ``inputs`` is a mapping by input name or a sequence in the model's input order; names,
        shapes and dtypes must match the graph's inputs exactly (:class:`ModelError` saying
        what was expected otherwise).
        """
        env: _Env = dict(self._constants)
        env.update(self._check_inputs(inputs))
        for step, release in zip(self._steps, self._release, strict=True):
            step(env)
            for name in release:
                env.pop(name, None)
        result = {}
        for info in self.graph.outputs:
            value = env[info.name]
            # A constant output is shared, read-only state; hand out a copy.
            result[info.name] = value.copy() if info.name in self._constants else value
        return result

    def __call__(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]
                 ) -> dict[str, np.ndarray]:
        return self.run(inputs)

    def _check_inputs(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]
                      ) -> dict[str, np.ndarray]:
        return check_inputs(self.graph.name, self.graph.inputs, inputs)


def check_inputs(model: str, expected: Sequence[TensorInfo],
                 inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray],
                 dim_names: Mapping[str, Sequence[str]] | None = None) -> dict[str, np.ndarray]:
    """``inputs`` by name, checked against ``expected``: names, numpy arrays, dtypes, shapes.

    A ``-1`` dimension of ``expected`` accepts any size (messages show it by its name from
    ``dim_names``, else ``?``). Raises :class:`ModelError` saying what was expected.
    """
    names = [i.name for i in expected]
    if isinstance(inputs, Mapping):
        missing = [n for n in names if n not in inputs]
        extra = sorted(set(inputs) - set(names))
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(map(repr, missing))}")
            if extra:
                parts.append(f"unknown {', '.join(map(repr, extra))}")
            raise ModelError(f"inputs for {model!r} do not match: {'; '.join(parts)}; the "
                             f"model's inputs are {_describe(expected, dim_names)}")
        given = dict(inputs)
    else:
        if isinstance(inputs, np.ndarray) or len(inputs) != len(expected):
            count = 1 if isinstance(inputs, np.ndarray) else len(inputs)
            raise ModelError(f"{model!r} takes {len(expected)} input(s) "
                             f"({_describe(expected, dim_names)}), got {count}"
                             + (" (pass a list or a dict of arrays)"
                                if isinstance(inputs, np.ndarray) else ""))
        given = dict(zip(names, inputs, strict=True))
    checked = {}
    for info in expected:
        value = given[info.name]
        if not isinstance(value, np.ndarray):
            raise ModelError(f"input {info.name!r} must be a numpy array, got "
                             f"{type(value).__name__}")
        if value.dtype != info.dtype:
            raise ModelError(f"input {info.name!r} has dtype {value.dtype}; the model expects "
                             f"{info.dtype} (convert with .astype(np.{info.dtype}))")
        if len(value.shape) != len(info.shape) or any(
                d >= 0 and d != v for d, v in zip(info.shape, value.shape, strict=False)):
            raise ModelError(f"input {info.name!r} has shape {list(value.shape)}; the model "
                             f"expects {_shape_text(info, dim_names)}")
        checked[info.name] = value
    return checked


def _shape_text(info: TensorInfo, dim_names: Mapping[str, Sequence[str]] | None) -> str:
    labels = (dim_names or {}).get(info.name, ())
    return "[" + ", ".join(str(d) if d >= 0 else (labels[k] if k < len(labels) else "?")
                           for k, d in enumerate(info.shape)) + "]"


def _argument(value: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if value.dtype != dtype:
        value = value.astype(dtype)
    return np.ascontiguousarray(value.reshape(shape))


def _describe(infos: Sequence[TensorInfo],
              dim_names: Mapping[str, Sequence[str]] | None = None) -> str:
    return ", ".join(f"{i.name!r} {i.dtype} {_shape_text(i, dim_names)}" for i in infos) or "none"
