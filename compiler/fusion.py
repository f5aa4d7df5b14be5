"""Kernel-pair fusion: two kernel nodes become one where an op kind knows how to run both.

After layout planning, a kernel whose output only one other kernel reads (not a graph
output) may fuse with that reader: each registered pair rule (an op kind's module registers
its own, e.g. :mod:`~tunecache.compiler.kinds.pwdw` for a 1x1 conv feeding a depthwise conv)
is asked, and the first that returns a node replaces both, at the reader's position (every
input of either is ready there). The intermediate tensor is then never stored. Generic: this
module never names a kind; the rules decide, on the nodes' ops alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tunecache.compiler.frontend import Graph, KernelNode, Step
from tunecache.compiler.kinds import all_kinds

__all__ = ["PairRule", "fuse_pairs", "register_pair_rule"]

PairRule = Callable[[KernelNode, KernelNode], KernelNode | None]
"""``(producer, reader)`` -> the fused node, or None when the rule does not apply."""

_RULES: list[PairRule] = []


def register_pair_rule(rule: PairRule) -> PairRule:
    """Add a pair rule (a kind module calls this when imported)."""
    if rule not in _RULES:
        _RULES.append(rule)
    return rule


def _readers(graph: Graph) -> dict[str, list[Step]]:
    out: dict[str, list[Step]] = {}
    for step in graph.steps:
        for tensor in dict.fromkeys(step.inputs):
            out.setdefault(tensor, []).append(step)
    return out


def _fused(producer: KernelNode, reader: Step) -> KernelNode | None:
    if not isinstance(reader, KernelNode):
        return None
    for rule in _RULES:
        node = rule(producer, reader)
        if node is not None:
            return node
    return None


def fuse_pairs(graph: Graph) -> tuple[Graph, int]:
    """``graph`` with every fusable producer-reader pair of kernel nodes fused, and how many
    pairs were (``graph`` itself when none)."""
    all_kinds()  # the kind modules register their rules when loaded
    readers = _readers(graph)
    outputs = {o.name for o in graph.outputs}
    replaced: dict[str, KernelNode] = {}
    dropped: set[str] = set()
    for step in graph.steps:
        if not isinstance(step, KernelNode) or step.name in dropped or step.name in replaced:
            continue
        users = readers.get(step.output, [])
        if step.output in outputs or len(users) != 1 or users[0].name in replaced:
            continue
        node = _fused(step, users[0])
        if node is not None:
            replaced[users[0].name] = node
            dropped.add(step.name)
    if not replaced:
        return graph, 0
    steps = tuple(replaced.get(s.name, s) for s in graph.steps if s.name not in dropped)
    return replace(graph, steps=steps), len(replaced)
