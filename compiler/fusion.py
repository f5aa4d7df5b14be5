"""Kernel-pair fusion: two kernel nodes become one where an op kind can run both.

After layout planning, a kernel whose output exactly one other kernel reads, as its first
input (the streamed operand), and which is not a graph output, is offered with that reader
to every kind's ``OpKind.fuses``: the first that returns an op replaces both nodes, at the
reader's position (every input of either is ready there), reading the producer's inputs and
then the reader's others. The intermediate tensor is never stored. A reshaping node between
the two (GPT-2's Gemm -> Reshape -> GELU) stays: the fused kernel, at the producer's place,
writes the producer's tensor, and the view now names what the reader wrote. Generic: the
pass never names a kind; a fused kind says which pairs it can replace (``pwdw``: a 1x1
conv2d and the depthwise conv2d reading it; ``matmul``: a matmul and the activation applied
to its result).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tunecache.compiler.graph import VIEW_OPS, Graph, KernelNode, OnnxNode, Step
from tunecache.compiler.kinds import all_kinds
from tunecache.compiler.ops import OpSignature

__all__ = ["KeepApart", "fuse_pairs", "fused_op"]

KeepApart = Callable[[KernelNode, OpSignature], bool]
"""A veto on one fusion: given the producer and the fused op, whether to leave the pair
apart (the precision policy's: a product it lowers is not fused into an op it would not)."""


def fused_op(producer: OpSignature, reader: OpSignature) -> OpSignature | None:
    """The op of the first kind that can run ``producer`` then ``reader`` as one, or None."""
    for kind in all_kinds():
        if kind.fuses is not None:
            op = kind.fuses(producer, reader)
            if op is not None:
                return op
    return None


def _readers(graph: Graph) -> dict[str, list[Step]]:
    out: dict[str, list[Step]] = {}
    for step in graph.steps:
        for tensor in dict.fromkeys(step.inputs):
            out.setdefault(tensor, []).append(step)
    return out


def _fused_node(producer: KernelNode, reader: Step, read: str,
                keep_apart: KeepApart | None = None) -> KernelNode | None:
    """The node running ``producer`` then ``reader`` (whose first input is ``read``: the
    producer's result or a view of it) and writing what the reader wrote, or None (also
    where ``keep_apart`` vetoes it)."""
    if (not isinstance(reader, KernelNode) or reader.inputs[0] != read
            or read in reader.inputs[1:]):
        return None
    op = fused_op(producer.op, reader.op)
    if op is None or (keep_apart is not None and keep_apart(producer, op)):
        return None
    return KernelNode(f"{producer.name}+{reader.name}", producer.nodes + reader.nodes, op,
                      producer.inputs + reader.inputs[1:], reader.output, reader.output_shape)


def _is_view(node: OnnxNode) -> bool:
    """A reshaping node: its one output is its first input's bytes under another shape."""
    return node.op_type in VIEW_OPS and len(node.inputs) >= 1 and not any(node.outputs[1:])


class _Fuser:
    """One pass over a graph's steps: which steps are replaced, renamed or dropped."""

    def __init__(self, graph: Graph, keep_apart: KeepApart | None) -> None:
        self.keep_apart = keep_apart
        self.readers = _readers(graph)
        self.outputs = {o.name for o in graph.outputs}
        self.replaced: dict[str, Step] = {}
        self.dropped: set[str] = set()

    def _sole_reader(self, tensor: str) -> Step | None:
        users = self.readers.get(tensor, [])
        if tensor in self.outputs or len(users) != 1 or users[0].name in self.replaced:
            return None
        return users[0]

    def visit(self, step: KernelNode) -> None:
        reader = self._sole_reader(step.output)
        if reader is None:
            return
        node = _fused_node(step, reader, step.output, self.keep_apart)
        if node is not None:
            self.replaced[reader.name] = node
            self.dropped.add(step.name)
            return
        if not isinstance(reader, OnnxNode) or not _is_view(reader) \
                or reader.inputs[0] != step.output:
            return
        # producer -> view -> reader: the fused kernel writes the producer's result, the view
        # now names the reader's output, and the reader goes.
        after = self._sole_reader(reader.outputs[0])
        if after is None or not isinstance(after, KernelNode) or after.name in self.dropped:
            return
        node = _fused_node(step, after, reader.outputs[0], self.keep_apart)
        if node is None:
            return
        self.replaced[step.name] = replace(node, output=step.output,
                                           output_shape=step.output_shape)
        self.replaced[reader.name] = replace(reader, outputs=(after.output, *reader.outputs[1:]))
        self.dropped.add(after.name)


def fuse_pairs(graph: Graph, keep_apart: KeepApart | None = None) -> tuple[Graph, int]:
    """``graph`` with every fusable producer-reader pair of kernel nodes fused (a reshaping
    node between them stays, renamed) but those ``keep_apart`` vetoes, and how many pairs
    were (``graph`` itself when none)."""
    fuser = _Fuser(graph, keep_apart)
    for step in graph.steps:
        if (isinstance(step, KernelNode) and step.name not in fuser.dropped
                and step.name not in fuser.replaced):
            fuser.visit(step)
    if not fuser.replaced:
        return graph, 0
    steps = tuple(fuser.replaced.get(s.name, s) for s in graph.steps
                  if s.name not in fuser.dropped)
    fused = sum(isinstance(s, KernelNode) for s in fuser.replaced.values())
    return replace(graph, steps=steps), fused
