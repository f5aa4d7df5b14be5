"""A step pass: element-wise chains over a kernel's channels join that kernel's epilogue.

A quantized network that was not pre-processed (BatchNormalization left unfolded, as
``onnxruntime.quantization`` warns) follows each quantized convolution with a
quantize-dequantize pair, the BatchNormalization's scale and shift, another pair, a Clip and
a third pair: three element-wise kernels, each reading and writing the whole activation
(27% of an int8 MobileNet-v2's time). Every one of those steps is per channel or scalar, so
the convolution can apply them to each output while it is still in registers.

A kernel whose kind says how its output lines up with a chain (``OpKind.channel_view``) and
whose sole reader is a chain of the steps an epilogue can take (``OpKind.chain_view``), over
the same rows and columns, with constant operands that are scalars or one value per channel,
becomes one kernel: the chain's steps (:data:`~tunecache.compiler.codegen.epilogue.CHAIN_STEPS`)
appended to its epilogue, their operands stacked into its ``chan`` rows. Repeated until no
chain is left to take. The results are the same floats in the same order of operations: the
kernels round the same values.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from tunecache.compiler.codegen.epilogue import (
    CHAIN_STEPS,
    RESIDUAL_STEP,
    chain_rows,
    operand_tensors,
)
from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.graph import KernelNode
from tunecache.compiler.kinds import ChainView, ChannelView, op_kind
from tunecache.compiler.lowering import StepContext, readers, register_step_pass
from tunecache.compiler.ops import OpSignature

__all__ = ["fold_chains"]


@register_step_pass
def fold_chains(steps: list[Any], ctx: StepContext) -> list[Any]:
    """``steps`` with every foldable chain joined to the kernel it reads."""
    steps, read, position = list(steps), readers(steps), 0
    while position < len(steps):
        folded = _fold(steps[position], steps, read, ctx)
        if folded is None:
            position += 1
            continue
        # The folded kernel stays at ``position`` and may take the next chain too.
        steps[position], reader = folded
        del steps[reader]
        read = readers(steps)
    return steps


def _fold(step: Any, steps: list[Any], read: dict[str, list[int]],
          ctx: StepContext) -> tuple[KernelNode, int] | None:
    """``step`` with its sole reader's chain in its epilogue, and the reader's position."""
    if not isinstance(step, KernelNode):
        return None
    view_of = op_kind(step.op.kind).channel_view
    view = view_of(step.op) if view_of is not None else None
    users = read.get(step.output, [])
    if view is None or len(users) != 1 or ctx.is_graph_output(step.output):
        return None
    reader = steps[users[0]]
    if not isinstance(reader, KernelNode) or step.output not in reader.inputs[:2]:
        return None
    chain_of = op_kind(reader.op.kind).chain_view
    chain = chain_of(reader.op) if chain_of is not None else None
    if chain is None or not _lines_up(chain, view):
        return None
    if chain.operand == "full":
        residual = _residual(step, reader, chain, steps)
        return None if residual is None else (residual, users[0])
    if reader.inputs[0] != step.output:
        return None
    rows = _channel_rows(chain, reader.inputs[1:], view, ctx)
    op = _with_chain(step.op, chain)
    if rows is None or op is None:
        return None
    inputs = list(step.inputs)
    earlier: tuple[np.ndarray, ...] = ()
    if chain_rows(step.op.epilogue):
        earlier = (ctx.constants[inputs.pop()],)
    chan = ctx.derived_constant(
        f"{step.name}_chain", ("chain", view.channels, chain.operand, chain.steps),
        (*earlier, *rows), lambda: np.concatenate([*earlier, np.stack(rows)]).astype(np.float32))
    node = replace(step, nodes=step.nodes + reader.nodes, op=op, inputs=(*inputs, chan),
                   output=reader.output, output_shape=reader.output_shape)
    return node, users[0]


def _residual(step: KernelNode, reader: KernelNode, chain: ChainView,
              steps: list[Any]) -> KernelNode | None:
    """``step`` with ``reader``'s residual add (``x + r``, either way round: the same float)
    and the unary chain steps after it in its epilogue (``radd``: ``r`` becomes its ``add``
    operand), or None: when its kind takes no residual, it has one already, or ``r`` is
    computed after it."""
    other = [name for name in reader.inputs if name != step.output]
    unary = all(CHAIN_STEPS.get(name) in ("relu", "clip6", "qround") for name in chain.steps[1:])
    spec = op_kind(step.op.kind).spec
    if (chain.steps[:1] != ("add",) or not unary or len(other) != 1 or len(reader.inputs) != 2
            or RESIDUAL_STEP not in spec.epilogue_tail
            or "add" in operand_tensors(step.op.epilogue)):
        return None
    made = {name: i for i, s in enumerate(steps)
            for name in ((s.output,) if isinstance(s, KernelNode) else getattr(s, "outputs", ()))}
    if made.get(other[0], -1) > steps.index(step):
        return None  # the residual is not there yet where the kernel runs
    try:
        op = OpSignature(step.op.kind, step.op.dims, step.op.dtype, step.op.attrs,
                         (*step.op.epilogue, RESIDUAL_STEP,
                          *(CHAIN_STEPS[name] for name in chain.steps[1:])))
    except OpSignatureError:
        return None
    inputs = list(step.inputs)
    inputs.insert(len(inputs) - bool(chain_rows(step.op.epilogue)), other[0])
    return replace(step, nodes=step.nodes + reader.nodes, op=op, inputs=tuple(inputs),
                   output=reader.output, output_shape=reader.output_shape)


def _lines_up(chain: ChainView, view: ChannelView) -> bool:
    """Whether ``chain`` runs over ``view``'s elements with its operands per channel: the
    same rows and columns, or any with scalar operands only."""
    if (chain.rows, chain.cols) == (view.rows, view.cols):
        return True
    return chain.operand in ("scalar", "full") and chain.rows * chain.cols == view.rows * view.cols


def _channel_rows(chain: ChainView, operands: tuple[str, ...], view: ChannelView,
                  ctx: StepContext) -> list[np.ndarray] | None:
    """Each operand as one value per channel, or None when one is not a constant that is a
    scalar or the same per-channel vector in every image."""
    out = []
    for name in operands:
        value = ctx.constants.get(name)
        if value is None:
            return None
        flat = np.asarray(value, dtype=np.float32).reshape(-1)
        if flat.size == 1:
            out.append(np.full(view.channels, flat[0], np.float32))
            continue
        if chain.operand != view.per_channel or flat.size % view.channels:
            return None
        images = flat.reshape(-1, view.channels)
        if not (images == images[:1]).all():
            return None
        out.append(images[0])
    return out


def _with_chain(op: OpSignature, chain: ChainView) -> OpSignature | None:
    """``op`` with ``chain``'s steps after its epilogue, or None where its kind refuses."""
    try:
        return OpSignature(op.kind, op.dims, op.dtype, op.attrs,
                           op.epilogue + tuple(CHAIN_STEPS[step] for step in chain.steps))
    except OpSignatureError:
        return None

