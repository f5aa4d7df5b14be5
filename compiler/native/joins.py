"""Joins: steps whose output is their inputs' bytes back to back, planned to cost nothing.

A ``Concat`` along an axis with only ones before it (``prod(shape[:axis]) == 1``: the
channels of one image, the rows of a matrix) lays every input out as one contiguous byte
range of its output. That holds for the layout planner's channel-blocked ``nchw{x}c``
tensors too: it blocks a Concat only along channels with all inputs blocked and each one's
channels in whole blocks (:mod:`~tunecache.compiler.layout_plan`), so with one image an
input's blocks are a contiguous range of the output's at the same byte offset.

:func:`place_joins` decides, over a whole program, which joins vanish:

* **in place**: every input is a tensor some step writes and no join has placed yet; each
  becomes the slice of the join's output at its offset, so its producer writes straight
  into the output;
* **a view**: every input already lies, in order and back to back, inside one tensor; the
  output is that range (DenseNet's growing concatenations are prefixes of its block's last).

Joins are visited last first, so a join's output is placed before its own inputs are: a
nested join's inputs land in the outer output, and earlier prefixes find the last
concatenation already laid out. A join that does neither stays a step (a numpy copy); if
its output was placed, the copy is written there. Every piece starts on an
:data:`~tunecache.compiler.native.arena.ALIGN` boundary like any arena tensor, so only the
last piece of a host has a ragged end, and the arena rounds that up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from tunecache.compiler.buffers import ALIGN
from tunecache.compiler.graph import FLOAT32, OnnxNode

Shapes = Mapping[str, tuple[tuple[int, ...], np.dtype]]


@dataclass(frozen=True, slots=True)
class Join:
    """A step whose output is its inputs' bytes back to back, in order."""

    output: str
    inputs: tuple[str, ...]
    sizes: tuple[int, ...]
    """Bytes of each input."""

    def offsets(self) -> tuple[int, ...]:
        """Byte offset of each input in the output."""
        return tuple(accumulate(self.sizes[:-1], initial=0))


@dataclass(frozen=True, slots=True)
class Placement:
    """What :func:`place_joins` decided."""

    slots: Mapping[str, tuple[str, int]]
    """Placed tensor -> (host, byte offset in it); a host is a join output placed nowhere."""
    vanished: frozenset[str]
    """Outputs of the joins that cost nothing (no step computes them)."""


def concat_join(node: OnnxNode, shapes: Shapes) -> Join | None:
    """``node`` (a Concat) as a :class:`Join` of float32 tensors, or None when its inputs are
    not contiguous ranges of its output."""
    if len(node.outputs) != 1 or not node.inputs or not all(node.inputs):
        return None
    if any(n not in shapes for n in (*node.inputs, node.outputs[0])):
        return None
    out_shape, out_dtype = shapes[node.outputs[0]]
    axis = int(node.attrs.get("axis", 0))
    axis += len(out_shape) if axis < 0 else 0
    if out_dtype != FLOAT32 or not 0 <= axis < len(out_shape) or \
            math.prod(out_shape[:axis]) != 1:
        return None
    sizes = []
    for name in node.inputs:
        shape, dtype = shapes[name]
        if dtype != FLOAT32 or math.prod(shape) == 0:
            return None
        sizes.append(math.prod(shape) * dtype.itemsize)
    if sum(sizes) != math.prod(out_shape) * out_dtype.itemsize:
        return None
    return Join(node.outputs[0], tuple(node.inputs), tuple(sizes))


JOIN_RULES: Mapping[str, Callable[[OnnxNode, Shapes], Join | None]] = {"Concat": concat_join}
"""How a numpy step of each ONNX op type is a :class:`Join`, when it is one."""


def join_of(node: OnnxNode, shapes: Shapes) -> Join | None:
    """``node`` as a :class:`Join`, or None (not a joining op, or not contiguous here)."""
    rule = JOIN_RULES.get(node.op_type)
    return rule(node, shapes) if rule is not None else None


def place_joins(joins: Sequence[Join], placeable: AbstractSet[str]) -> Placement:
    """Place the inputs of ``joins`` (in program order) inside their outputs (see the
    module doc). ``placeable``: tensors a step of the program writes that may live in the
    arena (never a graph input or a constant)."""
    parent: dict[str, tuple[str, int]] = {}
    vanished: set[str] = set()

    def locate(name: str) -> tuple[str, int]:
        offset = 0
        while name in parent:
            name, step = parent[name]
            offset += step
        return name, offset

    for join in reversed(joins):
        offsets = join.offsets()
        if any(o % ALIGN for o in offsets):
            continue
        if len(set(join.inputs)) == len(join.inputs) and \
                all(n in placeable and n not in parent for n in join.inputs):
            for name, offset in zip(join.inputs, offsets, strict=True):
                parent[name] = (join.output, offset)
            vanished.add(join.output)
            continue
        if join.output in parent or not all(n in parent for n in join.inputs):
            continue
        places = [locate(n) for n in join.inputs]
        host, start = places[0]
        if all(p == (host, start + o) for p, o in zip(places, offsets, strict=True)):
            parent[join.output] = (host, start)
            vanished.add(join.output)
    return Placement({name: locate(name) for name in parent}, frozenset(vanished))
