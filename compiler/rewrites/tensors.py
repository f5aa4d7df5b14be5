"""What a node rewrite reads and extends: the loader's shapes, dtypes and constants, and
:class:`NodeChain`, which writes one node as a chain of others."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from tunecache.compiler.onnx_nodes import ReadNode

__all__ = ["NodeChain", "RewriteTensors", "rewrite_each"]

Shape = tuple[int | None, ...]
Plan = TypeVar("Plan")


@dataclass(frozen=True)
class RewriteTensors:
    """The loader's tensor tables, which rewrites read and add to (the dicts are shared)."""

    shapes: dict[str, Shape]
    dtypes: dict[str, np.dtype]
    constants: dict[str, np.ndarray]
    opset: int

    def add_constant(self, name: str, value: np.ndarray) -> str:
        """Register ``value`` under ``name`` (suffixed where taken); the name used."""
        unique, k = name, 1
        while unique in self.constants or unique in self.shapes:
            unique, k = f"{name}_{k}", k + 1
        self.constants[unique] = np.ascontiguousarray(value)
        self.shapes[unique], self.dtypes[unique] = value.shape, value.dtype
        return unique


@dataclass
class NodeChain:
    """Nodes replacing ``node``, each reading the last; :meth:`finish` names the last one's
    output as ``node``'s first output and returns them."""

    node: ReadNode
    tensors: RewriteTensors
    made: list[ReadNode] = field(default_factory=list)
    shared: dict[str, str] = field(default_factory=dict)

    def constant(self, suffix: str, value: np.ndarray) -> str:
        return self.tensors.add_constant(f"{self._base}/{suffix}", value)

    def shared_constant(self, key: str, make: Callable[[], np.ndarray]) -> str:
        """The constant named by ``key``, made on first use: one copy however many nodes
        read it (an unrolled layer's weights at every step)."""
        if key not in self.shared:
            self.shared[key] = self.constant(key, make())
        return self.shared[key]

    def add(self, op_type: str, inputs: tuple[str, ...], shape: Shape, **attrs: object) -> str:
        """Append an ``op_type`` node; its output of ``shape`` (the first input's dtype)."""
        return self.add_multi(op_type, inputs, [shape], **attrs)[0]

    def add_multi(self, op_type: str, inputs: tuple[str, ...], shapes: list[Shape],
                  **attrs: object) -> list[str]:
        """Append an ``op_type`` node with one output per shape of ``shapes``."""
        base = f"{self._base}/{op_type.lower()}{len(self.made)}"
        targets = [base if len(shapes) == 1 else f"{base}_{k}" for k in range(len(shapes))]
        dtype = self.tensors.dtypes.get(self.node.inputs[0], np.dtype(np.float32))
        for target, shape in zip(targets, shapes, strict=True):
            self.tensors.shapes[target], self.tensors.dtypes[target] = shape, dtype
        self.made.append(replace(self.node, name=base.replace(self._base, self._name, 1),
                                 op_type=op_type, inputs=inputs, outputs=tuple(targets),
                                 attrs=dict(attrs)))
        return targets

    @property
    def _base(self) -> str:
        return next((o for o in self.node.outputs if o), self.node.name)

    @property
    def _name(self) -> str:
        return self.node.name or self._base

    def split(self, tensor: str, axis: int, sizes: list[int], shapes: list[Shape]) -> list[str]:
        """A Split into pieces of ``sizes`` along ``axis``, in the form the opset reads."""
        if self.tensors.opset < 13:
            return self.add_multi("Split", (tensor,), shapes, axis=axis, split=sizes)
        parts = self.constant("split", np.array(sizes, np.int64))
        return self.add_multi("Split", (tensor, parts), shapes, axis=axis)

    def rename(self, tensor: str, output: str) -> None:
        """Make the node producing ``tensor`` write ``output`` (one of the replaced node's
        outputs) instead."""
        for k, made in enumerate(self.made):
            if tensor in made.outputs:
                outs = tuple(output if o == tensor else o for o in made.outputs)
                self.made[k] = replace(made, outputs=outs)
                self.tensors.shapes.setdefault(output, self.tensors.shapes.pop(tensor))
                self.tensors.dtypes.setdefault(output, self.tensors.dtypes.pop(tensor))
                return
        raise KeyError(tensor)

    def reshape(self, tensor: str, shape: Shape) -> str:
        """A Reshape to ``shape`` (its first dim copied from the input: it may be unknown)."""
        target = self.constant("shape", np.array([0, *shape[1:]], np.int64))
        return self.add("Reshape", (tensor, target), shape)

    def slice(self, tensor: str, axes: list[int], starts: list[int], ends: list[int],
              shape: Shape, steps: list[int] | None = None) -> str:
        """A Slice with constant bounds, in the form the model's opset reads (``steps``
        from opset 10 only)."""
        if self.tensors.opset < 10:
            assert steps is None or set(steps) == {1}, "Slice takes steps from opset 10"
            return self.add("Slice", (tensor,), shape, axes=axes, starts=starts, ends=ends)
        named = [("starts", starts), ("ends", ends), ("axes", axes)] + \
            ([("steps", steps)] if steps else [])
        bounds = tuple(self.constant(name, np.array(v, np.int64)) for name, v in named)
        return self.add("Slice", (tensor, *bounds), shape)

    def reshape_all(self, tensor: str, shape: tuple[int, ...]) -> str:
        """A Reshape to ``shape``, every dim given."""
        target = self.constant("shape", np.array(shape, np.int64))
        return self.add("Reshape", (tensor, target), shape)

    def finish(self) -> list[ReadNode]:
        """The nodes, the last one writing the replaced node's first output (and named as
        it was)."""
        self.rename(self.made[-1].outputs[0], self.node.outputs[0])
        self.made[-1] = replace(self.made[-1], name=self.node.name)
        return self.made


def rewrite_each(nodes: list[ReadNode], tensors: RewriteTensors,
                 plan: Callable[[ReadNode, RewriteTensors], Plan | None],
                 apply: Callable[[ReadNode, Plan, RewriteTensors], list[ReadNode]]
                 ) -> list[ReadNode]:
    """``nodes`` with each node ``plan`` reads a plan from (None: left as it is) replaced by
    what ``apply`` makes of it."""
    out: list[ReadNode] = []
    for node in nodes:
        found = plan(node, tensors)
        out += [node] if found is None else apply(node, found, tensors)
    return out
