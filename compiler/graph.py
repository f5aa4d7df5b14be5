"""The model graph: what the ONNX reader produces and every later pass and runner consumes.

A :class:`Graph` holds a model's static inputs and outputs, its constants and its steps in
execution order. A step is a :class:`KernelNode` (one generated-kernel call, fusing one or
more ONNX nodes, keyed by an :class:`~tunecache.compiler.ops.OpSignature`) or an
:class:`OnnxNode` (a node run with numpy, :mod:`tunecache.compiler.onnx_ops`). Reading a
model (:mod:`tunecache.compiler.frontend`), lowering ONNX patterns onto kernels
(:mod:`tunecache.compiler.lowering`), the graph passes (:mod:`tunecache.compiler.passes`)
and the runners (:mod:`tunecache.compiler.executor`, :mod:`tunecache.compiler.native`) all
speak these types; this module imports none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from tunecache.compiler.errors import TunecacheError

if TYPE_CHECKING:
    from tunecache.compiler.ops import OpSignature

__all__ = ["FLOAT32", "VIEW_OPS", "Graph", "KernelNode", "ModelError", "OnnxNode",
           "QuantizedConstant", "Step", "TensorInfo"]

FLOAT32 = np.dtype(np.float32)

VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})
"""Ops whose output is their first input's bytes under another shape."""


class ModelError(TunecacheError):
    """An ONNX model cannot be read or run: malformed file, unsupported op, bad inputs."""


@dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: name, shape (``-1`` for a dimension left unknown), dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True, eq=False)
class QuantizedConstant:
    """Where a float32 constant came from when the loader folded a ``DequantizeLinear`` of
    integer constants: ``values`` (int8 or uint8), ``scale`` and ``zero_point`` (one
    element, or one per index of ``axis``), so a lowering can run the integer weights."""

    values: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int

    def along(self, axis: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``(scale, zero point)`` as vectors over ``axis`` of :attr:`values` (a per-tensor
        one broadcast), or None when they vary along another axis."""
        size = self.values.shape[axis]
        if self.scale.size == 1:
            return (np.full(size, self.scale.reshape(-1)[0], np.float32),
                    np.full(size, self.zero_point.reshape(-1)[0], np.int32))
        if self.axis != axis:
            return None
        return (self.scale.astype(np.float32).reshape(-1),
                self.zero_point.astype(np.int32).reshape(-1))


@dataclass(frozen=True)
class KernelNode:
    """One generated-kernel call, fusing one or more ONNX nodes.

    ``inputs`` name the tensors for the kernel's input arguments in
    ``op.arguments()`` order (A, B, [bias] for matmuls; X, W, [bias], [add] for conv2d);
    constants among them are entries of :attr:`Graph.constants`. The executor reshapes each
    to its argument's shape (same element count) and the kernel's output to ``output_shape``.
    """

    name: str
    nodes: tuple[str, ...]
    op: OpSignature
    inputs: tuple[str, ...]
    output: str
    output_shape: tuple[int, ...]


@dataclass(frozen=True)
class OnnxNode:
    """A node run with numpy (:mod:`tunecache.compiler.onnx_ops`).

    ``inputs``/``outputs`` keep ONNX's positions (``""`` for an omitted optional one).
    ``note`` says why a ``Conv``/``MatMul``/``Gemm`` node did not become a kernel (empty
    otherwise).
    """

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(compare=False, hash=False)
    note: str = ""


Step = KernelNode | OnnxNode


@dataclass(frozen=True, eq=False)
class Graph:
    """A loaded model: static inputs and outputs, constants, and steps in execution order."""

    name: str
    opset: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    constants: Mapping[str, np.ndarray]
    steps: tuple[Step, ...]
    tensors: Mapping[str, tuple[tuple[int, ...], np.dtype]] = field(
        default_factory=lambda: MappingProxyType({}))
    """Static shape and dtype of each tensor the loader inferred (steps' outputs among
    them); empty for graphs rewritten since (layout planning), whose shapes are traced."""

    @property
    def kernel_nodes(self) -> tuple[KernelNode, ...]:
        """The steps that call generated kernels, in execution order."""
        return tuple(s for s in self.steps if isinstance(s, KernelNode))

    @property
    def onnx_nodes(self) -> tuple[OnnxNode, ...]:
        """The steps run with numpy, in execution order."""
        return tuple(s for s in self.steps if isinstance(s, OnnxNode))
