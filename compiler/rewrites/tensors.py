"""What a node rewrite reads and extends: the loader's shapes, dtypes and constants, and
:class:`NodeChain`, which writes one node as a chain of others."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tunecache.compiler.onnx_nodes import ReadNode

__all__ = ["NodeChain", "RewriteTensors"]

Shape = tuple[int | None, ...]


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

    def constant(self, suffix: str, value: np.ndarray) -> str:
        return self.tensors.add_constant(f"{self.node.outputs[0]}/{suffix}", value)

    def add(self, op_type: str, inputs: tuple[str, ...], shape: Shape, **attrs: object) -> str:
        """Append an ``op_type`` node; its float32 output of ``shape``."""
        target = f"{self.node.outputs[0]}/{op_type.lower()}{len(self.made)}"
        self.tensors.shapes[target] = shape
        self.tensors.dtypes[target] = self.tensors.dtypes.get(self.node.inputs[0],
                                                              np.dtype(np.float32))
        self.made.append(replace(self.node, name=f"{self.node.name or self.node.outputs[0]}/"
                                 f"{op_type.lower()}{len(self.made)}", op_type=op_type,
                                 inputs=inputs, outputs=(target,), attrs=dict(attrs)))
        return target

    def reshape(self, tensor: str, shape: Shape) -> str:
        """A Reshape to ``shape`` (its first dim copied from the input: it may be unknown)."""
        target = self.constant("shape", np.array([0, *shape[1:]], np.int64))
        return self.add("Reshape", (tensor, target), shape)

    def slice(self, tensor: str, axes: list[int], starts: list[int], ends: list[int],
              shape: Shape) -> str:
        """A Slice with constant bounds, in the form the model's opset reads."""
        if self.tensors.opset < 10:
            return self.add("Slice", (tensor,), shape, axes=axes, starts=starts, ends=ends)
        bounds = tuple(self.constant(name, np.array(v, np.int64))
                       for name, v in (("starts", starts), ("ends", ends), ("axes", axes)))
        return self.add("Slice", (tensor, *bounds), shape)

    def finish(self) -> list[ReadNode]:
        last = self.made[-1]
        shape = self.tensors.shapes.pop(last.outputs[0])
        self.tensors.shapes.setdefault(self.node.outputs[0], shape)
        self.tensors.dtypes.setdefault(self.node.outputs[0],
                                       self.tensors.dtypes.pop(last.outputs[0]))
        self.made[-1] = replace(last, name=self.node.name, outputs=self.node.outputs[:1])
        return self.made
