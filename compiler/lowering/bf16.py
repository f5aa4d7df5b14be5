"""Activations flow between bf16 kernels as bfloat16, two bytes an element.

A bf16 kernel (the precision policy's, :mod:`tunecache.compiler.precision`) rounds its
input to bfloat16 as it packs it, so the float32 activation its writer stored holds two
bytes more per element than the reader keeps: a memory-bound 1x1 convolution of a CNN's
early stages spends as long converting X as multiplying. Where a bf16 kernel's output is
read only by bf16 kernels, as the input they round (``x``) or as a residual they add
(``add``), and each can hold it so (``OpKind.with_narrow``), the writer stores it rounded
to bfloat16 and the readers take it as it is: X is bit for bit what the reader would have
packed; a residual is rounded once more than in float32 (what OpenVINO's bf16 inference
does), which the policy's error against float32 reports.

Not a registered step pass: the policy chooses bf16 after the passes have run, on the
planned steps, and calls :func:`bfloat16_activations` then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tunecache.compiler.graph import KernelNode
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.lowering import readers

__all__ = ["bfloat16_activations"]

_ROLES = {"X": "x", "add": "add"}
"""The inputs a bf16 kernel may take as bfloat16, by argument name, and the tensor each is
in the ``narrow`` vocabulary."""


def bfloat16_activations(steps: Sequence[Any], outputs: frozenset[str]) -> list[Any]:
    """``steps`` with every activation written and read only by bf16 kernels that can hold
    it as bfloat16 held so; ``outputs`` (the graph's) stay float32."""
    steps = list(steps)
    read = readers(steps)  # a rewrite changes no step's inputs
    for position, writer in enumerate(steps):
        if not isinstance(writer, KernelNode) or writer.output in outputs:
            continue
        users = read.get(writer.output, [])
        made = _narrowed(writer, "y")
        roles = [_role(steps[at], writer.output) for at in users]
        if made is None or not users or None in roles:
            continue
        narrowed = [_narrowed(steps[at], role) for at, role in zip(users, roles, strict=True)
                    if role is not None]
        if len(narrowed) != len(users) or any(n is None for n in narrowed):
            continue
        steps[position] = made
        for at, node in zip(users, narrowed, strict=True):
            steps[at] = node
    return steps


def _role(step: Any, tensor: str) -> str | None:
    """How the bf16 kernel ``step`` reads ``tensor`` where it could take it as bfloat16
    (``x`` or ``add``), else None (another step, or one reading it twice)."""
    if not isinstance(step, KernelNode) or step.op.dtype != "bf16" or \
            step.inputs.count(tensor) != 1:
        return None
    names = [a.name for a in step.op.arguments() if a.role == "input"]
    return _ROLES.get(names[step.inputs.index(tensor)])


def _narrowed(step: KernelNode, role: str) -> KernelNode | None:
    """The bf16 kernel ``step`` holding ``role``'s tensor as bfloat16 too, or None."""
    to_narrow = op_kind(step.op.kind).with_narrow
    if step.op.dtype != "bf16" or to_narrow is None:
        return None
    op = to_narrow(step.op, frozenset({role}))
    return None if op is None else replace(step, op=op)
