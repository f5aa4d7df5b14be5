"""Layout planning: which activations of a loaded graph stay channel-blocked between kernels.

A convolution network's kernels run fastest on ``nchw{x}c`` activations (``x`` = the vector
width, :mod:`~tunecache.compiler.kinds.layouts`): a pixel's channels are whole vectors, so
neither the input nor the output is converted inside the kernel. :func:`plan_layouts`
chooses, per tensor, ``nchw`` or the machine's blocked layout and rewrites the graph:

* a tensor is **blocked** when its producer is a kernel whose kind can write it blocked
  (``OpKind.relayout``), at least one consumer reads it through a layout slot
  (``OpKind.layout_slots``), its channels fill whole blocks, and every kernel touching it
  accepts the resulting combination (a pooling or element-wise op keeps one layout; a
  convolution converts on the fly, so it can take a plain input and write a blocked one);
* every other reader of a blocked tensor (a numpy step, a kind without layouts, a graph
  output) reads a plain copy made by one ``reorder`` kernel right after the producer; a
  tensor of one pixel per channel needs none (its bytes are the same in both layouts);
* the other way round, a kernel that would convert a plain tensor on the fly but takes it
  blocked (a convolution after a grouped one whose groups are narrower than a block, as in
  ResNeXt's first stage) reads a blocked copy made by one ``reorder`` after the producer,
  when the tensor is at least :data:`BLOCKED_COPY_MIN_BYTES`;
* each kernel's op is rewritten with its layouts (``conv2d(..., layout=nchw8c,
  out_layout=nchw8c)``), so the cache key names exactly what runs, and tuning the planned
  graph's ops tunes what the compiled model executes.

Tensors keep their logical (ONNX) shapes in the graph; a blocked tensor holds the same
number of elements in another order, which only layout-aware kernels read. Generic: the
planner never names a kind, it asks the registry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from tunecache.compiler.graph import Graph, KernelNode, OnnxNode, Step
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.kinds.layouts import BLOCKED, NCHW, channel_block
from tunecache.compiler.kinds.reorder import reorder_op
from tunecache.compiler.ops import OpSignature

__all__ = ["BLOCKED_COPY_MIN_BYTES", "LayoutPlan", "blocked_layout", "plan_layouts"]

BLOCKED_COPY_MIN_BYTES = 32 << 10
"""The smallest plain tensor a convolution reads through a blocked copy: below an L1's worth
its on-the-fly gather costs less than one more kernel call."""


@dataclass(frozen=True, slots=True)
class LayoutPlan:
    """What :func:`plan_layouts` decided: the rewritten graph and its figures."""

    graph: Graph
    layout: str
    """The blocked layout used (``nchw`` when none was: no kind or machine allows it)."""
    blocked: frozenset[str]
    """Tensors stored blocked."""
    reorders: int
    """Conversion kernels inserted."""


def blocked_layout(hw: HardwareSpec) -> str | None:
    """The channel-blocked layout whose blocks are one ``hw`` vector, or None."""
    name = f"nchw{hw.lanes}c"
    return name if name in BLOCKED else None


def plan_layouts(graph: Graph, hw: HardwareSpec) -> LayoutPlan:
    """Keep ``graph``'s activations blocked between kernels that take them on ``hw`` (see
    the module doc); the graph unchanged when the machine's vectors have no layout."""
    layout = blocked_layout(hw)
    if layout is None:
        return LayoutPlan(graph, NCHW, frozenset(), 0)
    planner = _Planner(graph, layout)
    blocked = planner.solve()
    readers = planner.blocked_readers(blocked)
    if not blocked and not readers:
        return LayoutPlan(graph, layout, frozenset(), 0)
    steps, reorders = planner.rewrite(blocked, readers, layout)
    new = Graph(graph.name, graph.opset, graph.inputs, graph.outputs, graph.constants,
                tuple(steps))
    return LayoutPlan(new, layout, frozenset(blocked), reorders)


@dataclass(frozen=True, slots=True)
class _Node:
    """A step that can take blocked activations: a kernel whose kind has layouts, or a
    layout-transparent numpy step (:data:`TRANSPARENT`)."""

    step: KernelNode | OnnxNode
    slots: tuple[str | None, ...]
    relayout: Callable[[str, str], OpSignature | bool | None]

    @property
    def output(self) -> str:
        return self.step.output if isinstance(self.step, KernelNode) else self.step.outputs[0]

    def slot_inputs(self, slot: str) -> Iterable[str]:
        return (t for t, s in zip(self.step.inputs, self.slots, strict=False) if s == slot)


def _channel_concat(node: OnnxNode, shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """A Concat of 4-D tensors along channels: per image, the blocked inputs' bytes follow
    each other exactly as the blocked output's do, so numpy's concatenation of the logical
    shapes is right for both layouts."""
    ins = [shapes.get(t) for t in node.inputs]
    return all(s is not None and len(s) == 4 for s in ins) and node.attrs.get("axis") in (1, -3)


TRANSPARENT: Mapping[str, Callable[[OnnxNode, Mapping[str, tuple[int, ...]]], bool]] = {
    "Concat": _channel_concat,
}
"""Numpy steps that compute the same bytes on blocked inputs (every input and the output
in one layout, channels in whole blocks), by ONNX op type."""


def _kernel_node(step: KernelNode) -> _Node | None:
    kind = op_kind(step.op.kind)
    if kind.layout_slots is None or kind.relayout is None:
        return None
    relayout = kind.relayout
    return _Node(step, kind.layout_slots(step.op), lambda src, dst: relayout(step.op, src, dst))


class _Planner:
    """The fixed point of the blocking rules over one graph (see :func:`plan_layouts`)."""

    def __init__(self, graph: Graph, layout: str) -> None:
        self.graph = graph
        self.layout = layout
        self.block = channel_block(layout)
        self.nodes: dict[str, _Node] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for step in graph.steps:
            node = self._node(step)
            if node is not None:
                self.nodes[step.name] = node
        self.slot_readers: dict[str, int] = {}
        for node in self.nodes.values():
            for t, slot in zip(node.step.inputs, node.slots, strict=False):
                if slot is not None:
                    self.slot_readers[t] = self.slot_readers.get(t, 0) + 1

    def _node(self, step: Step) -> _Node | None:
        if isinstance(step, KernelNode):
            self.shapes[step.output] = step.output_shape
            return _kernel_node(step)
        rule = TRANSPARENT.get(step.op_type)
        if rule is None or len(step.outputs) != 1 or not rule(step, self.shapes):
            return None
        first = self.shapes[step.inputs[0]]
        channels = sum(self.shapes[t][1] for t in step.inputs)
        self.shapes[step.outputs[0]] = (first[0], channels, *first[2:])
        return _Node(step, ("in",) * len(step.inputs), lambda src, dst: src == dst)

    def _blockable(self, tensor: str) -> bool:
        shape = self.shapes.get(tensor)
        return (shape is not None and len(shape) == 4 and shape[1] % self.block == 0
                and tensor not in self.graph.constants)

    def one_pixel(self, tensor: str) -> bool:
        """One pixel per channel: the blocked bytes are the plain ones."""
        shape = self.shapes[tensor]
        return shape[2] * shape[3] == 1

    def solve(self) -> set[str]:
        blocked = {n.output for n in self.nodes.values() if self._blockable(n.output)}
        changed = True
        while changed:
            changed = False
            for node in self.nodes.values():
                if self._layouts(node, blocked) is None:
                    touched = {node.output, *node.slot_inputs("in"),
                               *node.slot_inputs("out")}
                    changed |= bool(touched & blocked)
                    blocked -= touched
            for t in [t for t in blocked if not self.slot_readers.get(t)
                      and not self.one_pixel(t)]:
                blocked.discard(t)
                changed = True
        return blocked

    def _layouts(self, node: _Node, blocked: set[str]) -> tuple[bool, bool] | None:
        """(input blocked, output blocked) for ``node`` under ``blocked``, or None when its
        kind cannot take that combination."""
        ins = {t in blocked for t in node.slot_inputs("in")}
        outs = {t in blocked for t in node.slot_inputs("out")} | {node.output in blocked}
        if len(ins) > 1 or len(outs) > 1:
            return None
        src, dst = (ins.pop() if ins else False), outs.pop()
        ok = node.relayout(self.layout if src else NCHW, self.layout if dst else NCHW)
        return (src, dst) if ok else None

    def rewrite(self, blocked: set[str], readers: Mapping[str, str],
                layout: str) -> tuple[list[Step], int]:
        """The graph's steps with blocked ops, renamed blocked tensors and reorders (both
        ways: ``readers`` from :meth:`blocked_readers`)."""
        outputs = {o.name for o in self.graph.outputs}
        plain_readers = _plain_readers(self.graph, self.nodes)
        copies = {t for t in blocked if not self.one_pixel(t)
                  and (t in outputs or plain_readers.get(t))}
        stored = {t: (f"{t}@{layout}" if t in copies else t) for t in blocked}
        steps: list[Step] = []
        for step in self.graph.steps:
            steps.append(self._rewritten(step, blocked, stored, readers, layout))
            for t in _written(step):
                if t in copies:
                    steps.append(self._reorder(step.name, t, (stored[t], t), (layout, NCHW)))
                if t in readers.values():
                    steps.append(self._reorder(step.name, t, (t, f"{t}@{layout}"),
                                               (NCHW, layout)))
        return steps, len(copies) + len(set(readers.values()))

    def blocked_readers(self, blocked: set[str]) -> dict[str, str]:
        """``{reader step: tensor}`` for a plain tensor a step writes whose reader would
        convert it on the fly and takes it blocked: it reads a blocked copy instead, made
        by one reorder after the producer (a convolution after a grouped one whose groups
        are narrower than a block reads the plain channels a vector apart otherwise)."""
        written = {t for step in self.graph.steps for t in _written(step)}
        out: dict[str, str] = {}
        for node in self.nodes.values():
            ins = list(node.slot_inputs("in"))
            if len(ins) != 1 or ins[0] in blocked or ins[0] not in written or \
                    not self._blockable(ins[0]) or self.one_pixel(ins[0]) or \
                    4 * math.prod(self.shapes[ins[0]]) < BLOCKED_COPY_MIN_BYTES:
                continue
            if node.relayout(self.layout, self.layout if node.output in blocked else NCHW):
                out[node.step.name] = ins[0]
        return out

    def _rewritten(self, step: Step, blocked: set[str], stored: Mapping[str, str],
                   readers: Mapping[str, str], layout: str) -> Step:
        node = self.nodes.get(step.name)
        if node is None:
            return step
        copy = readers.get(step.name)
        inputs = tuple((f"{t}@{layout}" if t == copy else stored.get(t, t))
                       if slot is not None else t
                       for t, slot in zip(step.inputs, node.slots, strict=False))
        inputs += step.inputs[len(inputs):]
        if isinstance(step, OnnxNode):
            return replace(step, inputs=inputs,
                           outputs=tuple(stored.get(t, t) for t in step.outputs))
        ins = copy is not None or any(t in blocked for t in node.slot_inputs("in"))
        op = node.relayout(layout if ins else NCHW, layout if step.output in blocked else NCHW)
        assert isinstance(op, OpSignature)  # solve() checked this combination
        return replace(step, op=op, inputs=inputs, output=stored.get(step.output, step.output))

    def _reorder(self, producer: str, tensor: str, names: tuple[str, str],
                 layouts: tuple[str, str]) -> KernelNode:
        """The reorder after ``producer`` of ``tensor`` from ``names[0]`` in ``layouts[0]``
        to ``names[1]`` in ``layouts[1]``."""
        n, c, h, w = shape = self.shapes[tensor]
        return KernelNode(f"{producer}/{layouts[1]}", (),
                          reorder_op(n, c, h, w, src=layouts[0], dst=layouts[1]),
                          (names[0],), names[1], shape)


def _written(step: Step) -> tuple[str, ...]:
    return (step.output,) if isinstance(step, KernelNode) else step.outputs


def _plain_readers(graph: Graph, nodes: Mapping[str, _Node]) -> dict[str, int]:
    """How many reads of each tensor need it plain: numpy steps, kinds without layouts and
    layout-free arguments."""
    counts: dict[str, int] = {}
    for step in graph.steps:
        node = nodes.get(step.name)
        slots = node.slots if node is not None else ()
        for i, t in enumerate(step.inputs):
            if t and (i >= len(slots) or slots[i] is None):
                counts[t] = counts.get(t, 0) + 1
    return counts
