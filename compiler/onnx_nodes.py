"""ONNX nodes as the reader holds them, and the clean-ups of a folded node list.

A :class:`ReadNode` is a node of the model with plain-Python attributes and its original
position. Before lowering, the reader (:mod:`tunecache.compiler.frontend`) drops what needs
no step: nodes whose outputs nothing reads (:func:`live`), inference no-ops such as
``Identity``, ``Dropout`` and a ``Cast`` to the dtype its input has (:func:`elide`), and
repeated computations (:func:`deduplicate`). Each returns a new list, renaming the inputs of
the nodes that read what was dropped.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tunecache.compiler import onnx_ops

__all__ = ["NONDETERMINISTIC", "ReadNode", "deduplicate", "elide", "live"]

NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                              "RandomUniformLike", "Multinomial", "Bernoulli"})
"""Ops whose value is not a function of their inputs: never folded, however constant, and
never taken for a repeat of an earlier node."""

_SMALL_CONSTANT = 64
"""Constants this small are compared by value when looking for repeated computations."""


@dataclass
class ReadNode:
    """A node being loaded: its original position and plain-Python attributes."""

    index: int
    name: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]
    proto: Any
    domain: str = ""

    @property
    def supported(self) -> bool:
        """Whether the executor can run this node (default domain, an op in onnx_ops)."""
        return not self.domain and self.op_type in onnx_ops.OPS


def live(nodes: list[ReadNode], outputs: set[str]) -> list[ReadNode]:
    """Drop nodes whose outputs nothing needs (left behind by constant folding)."""
    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(o in needed for o in node.outputs if o):
            kept.append(node)
            needed.update(t for t in node.inputs if t)
    return kept[::-1]


def elide(nodes: list[ReadNode], outputs: set[str],
          dtypes: Mapping[str, np.dtype]) -> list[ReadNode]:
    """Drop inference no-ops (Identity, Dropout, a Cast to the dtype its input already
    has) so that fusion sees through them."""
    used = {t for node in nodes for t in node.inputs}
    alias: dict[str, str] = {}
    kept = []
    for node in nodes:
        if any(t in alias for t in node.inputs):
            node = replace(node, inputs=tuple(alias.get(t, t) for t in node.inputs))
        out = node.outputs[0]
        if (node.op_type in ("Identity", "Dropout") or _same_type_cast(node, dtypes)) and \
                out not in outputs and not any(
                o and (o in used or o in outputs) for o in node.outputs[1:]):
            alias[out] = node.inputs[0]
            continue
        kept.append(node)
    return kept


def deduplicate(nodes: list[ReadNode], outputs: set[str],
                constants: Mapping[str, np.ndarray]) -> list[ReadNode]:
    """Drop a node computing what an earlier one did (same op and attributes, the same
    inputs, small constants compared by value): its readers read the earlier outputs.
    Exporters repeat per layer what depends only on the inputs (BERT's 12 identical
    attention-mask ``Where``s)."""
    seen: dict[Hashable, ReadNode] = {}
    alias: dict[str, str] = {}
    kept = []
    for node in nodes:
        if any(t in alias for t in node.inputs):
            node = replace(node, inputs=tuple(alias.get(t, t) for t in node.inputs))
        key = _computation(node, constants)
        earlier = seen.get(key) if key is not None else None
        if earlier is not None and len(earlier.outputs) == len(node.outputs) and \
                not any(o in outputs for o in node.outputs):
            alias.update((o, e) for o, e in zip(node.outputs, earlier.outputs, strict=True)
                         if o)
            continue
        if key is not None:
            seen.setdefault(key, node)
        kept.append(node)
    return kept


def _computation(node: ReadNode, constants: Mapping[str, np.ndarray]) -> Hashable | None:
    """What ``node`` computes, as a hashable value; None when unsure (a random op,
    another domain, an attribute that is not a plain value, a missing output)."""
    if node.domain or node.op_type in NONDETERMINISTIC or not all(node.outputs):
        return None
    attrs = []
    for name, value in sorted(node.attrs.items()):
        plain = tuple(value) if isinstance(value, (list, tuple)) else value
        if not isinstance(plain, (int, float, str, bytes, tuple)) or (
                isinstance(plain, tuple) and not all(
                    isinstance(v, (int, float, str, bytes)) for v in plain)):
            return None
        attrs.append((name, plain))
    inputs = tuple(_input_identity(t, constants) for t in node.inputs)
    return node.op_type, inputs, tuple(attrs)


def _input_identity(name: str, constants: Mapping[str, np.ndarray]) -> Hashable:
    value = constants.get(name)
    if value is not None and value.size <= _SMALL_CONSTANT:
        return "value", value.dtype.str, value.shape, value.tobytes()
    return "tensor", name


def _same_type_cast(node: ReadNode, dtypes: Mapping[str, np.dtype]) -> bool:
    if node.op_type != "Cast" or not node.inputs:
        return False
    target = onnx_ops.ONNX_DTYPES.get(int(node.attrs.get("to", 0)))
    return target is not None and dtypes.get(node.inputs[0]) == target
