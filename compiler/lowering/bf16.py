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

On hardware with bf16 matrix tiles the activations handed over so are also stored in
blocks of one tile row (``TILE_ROW_LAYOUT``, 32 channels): a reader that would pack its X
into such blocks (a 1x1 convolution) reads it in place. A residual lies in its reader's
output layout, so a writer changes layout only together with every convolution it hands a
residual to, and each of those only with the writer of its own residual.

Not a registered step pass: the policy chooses bf16 after the passes have run, on the
planned steps, and calls :func:`bfloat16_activations` then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tunecache.compiler.graph import KernelNode
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.kinds.layouts import TILE_ROW_LAYOUT, channel_block
from tunecache.compiler.lowering import readers

__all__ = ["bfloat16_activations"]

_ROLES = {"X": "x", "A": "x", "add": "add", "Q": "q", "K": "k", "V": "v"}
"""The inputs a bf16 kernel may take as bfloat16, by argument name (a matmul's activation is
its A; attention's are Q, K and V), and the tensor each is in the ``narrow`` vocabulary."""


def bfloat16_activations(steps: Sequence[Any], outputs: frozenset[str],
                         tile_rows: bool = False) -> list[Any]:
    """``steps`` with every activation written and read only by bf16 kernels that can hold
    it as bfloat16 held so; ``outputs`` (the graph's) stay float32. With ``tile_rows``
    (the machine has bf16 matrix tiles), those activations in tile-row blocks where the
    residuals allow."""
    narrowed = _narrow(list(steps), outputs)
    return _tile_row_blocks(narrowed) if tile_rows else narrowed


def _narrow(steps: list[Any], outputs: frozenset[str]) -> list[Any]:
    """``steps`` with the activations bf16 kernels alone write and read as bfloat16."""
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


def _tile_row_blocks(steps: list[Any]) -> list[Any]:
    """``steps`` with the bfloat16 activations between bf16 kernels in tile-row blocks,
    where every writer, reader and residual involved can change its layout together; the
    steps as they were where a kernel cannot take the layout."""
    moved = _movable(steps)
    out = list(steps)
    for at, step in enumerate(steps):
        relayout = _relayout_of(step)
        if relayout is None:
            continue
        x = _inputs_named(step, "X")
        src = TILE_ROW_LAYOUT if x and x[0] in moved else _layouts(step.op)[0]
        dst = TILE_ROW_LAYOUT if step.output in moved else _layouts(step.op)[1]
        if (src, dst) == _layouts(step.op):
            continue
        op = relayout(step.op, src, dst)
        if op is None:
            return steps
        out[at] = replace(step, op=op)
    return out


def _movable(steps: list[Any]) -> set[str]:
    """The bfloat16 activations that can move to tile-row blocks: each written and read by
    kernels that take them, in whole blocks of channels, whose residual (if any) moves too,
    read as a residual only by kernels whose outputs move too (a residual lies in its
    reader's output layout), and moving with the other activation of a kernel that keeps
    one block size (a bf16 depthwise conv2d's float32 kernel)."""
    block = channel_block(TILE_ROW_LAYOUT)
    read = readers(steps)
    # whole blocks only: a kernel's output holds as many elements as its ONNX shape
    moved = {s.output for s in steps
             if _takes_tile_rows(s) and s.op.arguments()[-1].dtype == "bfloat16"
             and len(s.output_shape) == 4 and s.output_shape[1] % block == 0
             and all(_takes_tile_rows(steps[at]) for at in read.get(s.output, []))}
    writer = {s.output: s for s in steps if isinstance(s, KernelNode)}
    residual_readers: dict[str, list[str]] = {}
    for s in steps:
        for t in _inputs_named(s, "add"):
            residual_readers.setdefault(t, []).append(s.output)
    changed = True
    while changed:
        kept = {t for t in moved
                if all(a in moved for a in _inputs_named(writer[t], "add"))
                and all(r in moved for r in residual_readers.get(t, []))}
        kept -= _mismatched(steps, kept)
        changed, moved = kept != moved, kept
    return moved


def _mismatched(steps: list[Any], moved: set[str]) -> set[str]:
    """The activations in ``moved`` that a kernel could not take in tile-row blocks beside
    its other activation as it lies (X moved and its output not, or the reverse, where the
    kernel has one block size for both)."""
    out: set[str] = set()
    for step in steps:
        relayout, x = _relayout_of(step), _inputs_named(step, "X")
        if relayout is None or not x:
            continue
        src = TILE_ROW_LAYOUT if x[0] in moved else _layouts(step.op)[0]
        dst = TILE_ROW_LAYOUT if step.output in moved else _layouts(step.op)[1]
        if relayout(step.op, src, dst) is None:
            out |= {x[0], step.output} & moved
    return out


def _layouts(op: Any) -> tuple[str, str]:
    """The layouts ``op`` reads and writes its activations in: its ``layout`` attribute, and
    its ``out_layout`` where it has one (a kind with one layout for both has none)."""
    attrs: dict[str, str] = dict(op.attrs)
    return attrs["layout"], attrs.get("out_layout", attrs["layout"])


def _takes_tile_rows(step: Any) -> bool:
    """Whether the bf16 kernel ``step`` can read and write tile-row blocks."""
    relayout = _relayout_of(step)
    return relayout is not None and relayout(step.op, TILE_ROW_LAYOUT, TILE_ROW_LAYOUT) is not None


def _relayout_of(step: Any) -> Any:
    """The bf16 kernel ``step``'s ``OpKind.relayout`` where it has layouts, else None."""
    if not isinstance(step, KernelNode) or step.op.dtype != "bf16":
        return None
    kind = op_kind(step.op.kind)
    return kind.relayout if kind.layout_slots is not None else None


def _inputs_named(step: Any, name: str) -> list[str]:
    """The tensors a kernel step passes as its argument ``name`` (none for other steps)."""
    if not isinstance(step, KernelNode):
        return []
    names = [a.name for a in step.op.arguments() if a.role == "input"]
    return [t for t, n in zip(step.inputs, names, strict=False) if n == name]
