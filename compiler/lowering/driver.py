"""The walk that lowers a folded, sorted node list into the steps of a graph.

:func:`lower_nodes` visits the nodes in execution order and, at each node not yet taken by
an earlier fusion, asks the lowerings registered for its op type
(:func:`~tunecache.compiler.lowering.lowerings_for`), in order, to turn it and followers it
fuses into one :class:`~tunecache.compiler.graph.KernelNode`; a node no lowering takes
becomes an :class:`~tunecache.compiler.graph.OnnxNode`, run with numpy (with the reason of a
lowering registered with ``explains``, the ``Conv``/``MatMul``/``Gemm`` kernel mapping, as its
note). The registered step passes then rewrite the steps. :class:`Lowerer` is the view both
have of the graph (:class:`~tunecache.compiler.lowering.FusionContext`,
:class:`~tunecache.compiler.lowering.StepContext`); it knows nothing of ONNX files.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from tunecache.compiler.graph import (
    FLOAT32,
    KernelNode,
    ModelError,
    OnnxNode,
    QuantizedConstant,
    Step,
)
from tunecache.compiler.lowering import (
    explains,
    lowerings_for,
    producers,
    readers,
    step_passes,
)
from tunecache.compiler.memo import IdentityMemo

if TYPE_CHECKING:
    from tunecache.compiler.ops import OpSignature

__all__ = ["Lowerer", "SourceNode", "lower_nodes"]


class SourceNode(Protocol):
    """What the walk reads of a node: a lowering's view plus the node's op domain."""

    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]
    domain: str


def lower_nodes(nodes: Sequence[SourceNode], outputs: set[str], opset: int,
                constants: dict[str, np.ndarray],
                shapes: dict[str, tuple[int | None, ...]], dtypes: dict[str, np.dtype],
                derived: IdentityMemo[np.ndarray],
                quantized: Mapping[str, QuantizedConstant] | None = None,
                int8_kernels: bool = True) -> list[Step]:
    """The steps for ``nodes`` (folded, in execution order; ``outputs`` the graph's outputs):
    lowered onto kernels where a registered lowering applies, then rewritten by the step
    passes. ``constants``, ``shapes`` and ``dtypes`` are the model's, updated in place with
    the constants and helper tensors the lowerings add; ``derived`` keeps constants computed
    from others for the model's next load; ``quantized`` says which float32 constants were
    dequantized integers; ``int8_kernels`` whether their products become int8 kernels."""
    lowerer = Lowerer(nodes, outputs, opset, constants, shapes, dtypes, derived, quantized)
    lowerer.int8_kernels = int8_kernels
    steps = lowerer.fuse()
    for rewrite in step_passes():
        steps = rewrite(steps, lowerer)
    return steps


class Lowerer:
    """One walk over a node list, and the view lowerings and step passes have of it."""

    def __init__(self, nodes: Sequence[SourceNode], outputs: set[str], opset: int,
                 constants: dict[str, np.ndarray],
                 shapes: dict[str, tuple[int | None, ...]], dtypes: dict[str, np.dtype],
                 derived: IdentityMemo[np.ndarray],
                 quantized: Mapping[str, QuantizedConstant] | None = None) -> None:
        self.nodes = nodes
        self._quantized = dict(quantized or {})
        self.int8_kernels = True
        self.graph_outputs = outputs
        self.opset = opset
        self.constants = constants
        self.shapes = shapes
        self.dtypes = dtypes
        self.derived = derived
        # Per tensor, the position of each read (a node reading it twice counts twice).
        self.readers = readers(nodes)
        self.producers = producers(nodes)
        self.taken = [False] * len(nodes)
        self.helpers: list[OnnxNode] = []

    def fuse(self) -> list[Step]:
        """The steps: per node not taken, the kernel of the first lowering that applies (at
        the position of the last node it took, after the helper nodes it added), or the node
        itself, run with numpy."""
        slots: list[list[Step]] = [[] for _ in self.nodes]
        for position, node in enumerate(self.nodes):
            if self.taken[position]:
                continue
            lowered = self._lowered(position)
            if isinstance(lowered, tuple):
                kernel, last, helpers = lowered
                slots[last] += [*helpers, kernel]
                continue
            slots[position].append(OnnxNode(node.name, node.op_type, node.inputs, node.outputs,
                                            MappingProxyType(node.attrs), lowered))
        return [step for slot in slots for step in slot]

    def _lowered(self, position: int) -> tuple[KernelNode, int, list[OnnxNode]] | str:
        """The first registered lowering (:mod:`tunecache.compiler.lowering`) that turns the
        node at ``position`` into a kernel, with the helper nodes it added (run just before
        the kernel), or the note of the numpy node it stays: the reason the last lowering
        registered with ``explains`` gave, else empty."""
        node = self.nodes[position]
        note = ""
        if node.domain:
            return note
        for lowering in lowerings_for(node.op_type):
            self.helpers = []
            built = lowering(self, position)
            if isinstance(built, tuple):
                return built[0], built[1], self.helpers
            if isinstance(built, str) and explains(lowering):
                note = built
        return note

    # -- the view lowerings have of the graph (lowering.FusionContext) ---------------------

    def shape(self, name: str) -> tuple[int, ...] | None:
        shape = self.shapes.get(name)
        if shape is None or None in shape:
            return None
        return cast(tuple[int, ...], shape)

    def is_float32(self, name: str) -> bool:
        return self.dtypes.get(name) == FLOAT32

    def producer(self, tensor: str) -> int | None:
        return self.producers.get(tensor)

    def uses(self, tensor: str) -> int:
        return len(self.readers.get(tensor, ()))

    def sole_consumer(self, tensor: str) -> int | None:
        if self.uses(tensor) != 1 or tensor in self.graph_outputs:
            return None
        position = self.readers[tensor][-1]
        return None if self.taken[position] else position

    def consumers_of(self, tensor: str) -> tuple[int, ...]:
        return tuple(sorted(set(self.readers.get(tensor, ()))))

    def consumers(self, tensor: str) -> tuple[int, ...] | None:
        readers = self.readers.get(tensor, [])
        if not readers or tensor in self.graph_outputs or any(self.taken[p] for p in readers):
            return None
        return tuple(sorted(set(readers)))

    def add_node(self, op_type: str, inputs: list[str], attrs: dict[str, Any],
                 shape: tuple[int, ...], dtype: np.dtype | None = None) -> str:
        name = self._fresh_name(f"{inputs[0]}/{op_type.lower()}")
        self.shapes[name] = tuple(int(d) for d in shape)
        self.dtypes[name] = dtype if dtype is not None else self.dtypes.get(inputs[0], FLOAT32)
        self.helpers.append(OnnxNode(name, op_type, tuple(inputs), (name,),
                                     MappingProxyType(dict(attrs))))
        return name

    def add_constant(self, base: str, array: np.ndarray) -> str:
        name = self._fresh_name(base)
        self._set_constant(name, np.ascontiguousarray(array, dtype=FLOAT32))
        return name

    def add_typed_constant(self, base: str, array: np.ndarray) -> str:
        name = self._fresh_name(base)
        self._set_constant(name, np.ascontiguousarray(array))
        return name

    def quantized(self, name: str) -> QuantizedConstant | None:
        return self._quantized.get(name)

    def is_graph_output(self, name: str) -> bool:
        return name in self.graph_outputs

    def derived_constant(self, base: str, key: Hashable, sources: tuple[np.ndarray, ...],
                         make: Callable[[], np.ndarray]) -> str:
        def made() -> np.ndarray:
            array = np.ascontiguousarray(make(), dtype=FLOAT32)
            array.flags.writeable = False
            return array

        array = self.derived.get(sources, key, made)
        name = self._fresh_name(base)
        self._set_constant(name, array)
        return name

    def finish(self, position: int, fused: list[int], sig: OpSignature, inputs: list[str],
               output: str) -> tuple[KernelNode, int] | str:
        out_shape = self.shape(output)
        if out_shape is None:
            raise ModelError(f"cannot determine the shape of {output!r}, the output of node "
                             f"{self.nodes[fused[-1]].name!r}; give static input shapes")
        produced = next(a.shape for a in sig.arguments() if a.role == "output")
        if math.prod(produced) != math.prod(out_shape):  # pragma: no cover - defensive
            return f"kernel output {produced} does not match the ONNX output {out_shape}"
        for p in fused:
            self.taken[p] = True
        node = KernelNode(self.nodes[position].name, tuple(self.nodes[p].name for p in fused),
                          sig, tuple(inputs), output, out_shape)
        return node, fused[-1]

    def _set_constant(self, name: str, array: np.ndarray) -> None:
        self.constants[name] = array
        self.shapes[name] = tuple(array.shape)
        self.dtypes[name] = array.dtype

    def _fresh_name(self, base: str) -> str:
        """``base``, or ``base`` with a number after it: a tensor name not yet in use."""
        name = base
        n = 1
        while name in self.constants or name in self.shapes:
            n += 1
            name = f"{base}{n}"
        return name

