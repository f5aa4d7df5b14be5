"""A step pass: quantized activations flow between int8 kernels as uint8, a byte an element.

After the lowerings and the chain fold, an int8 kernel reads a float32 activation and
quantizes it with its ``qa = [scale, zero point]`` (:mod:`.quantized`), and the kernel that
wrote that activation often ends its epilogue with the same quantizer's
quantize-dequantize pair (:mod:`.chains`): four bytes an element go through memory for a
value that fits in one, and every reader divides by the scale again. Where every reader of
a kernel's output can take it as uint8 (``OpKind.with_narrow``) — an int8 kernel quantizing
it with one ``[scale, zero point]`` (its ``x``), or a residual it adds (its ``add``, which
it dequantizes with ``aq``) — the writer ends its epilogue with that quantizer instead
(``cdiv+cmax+cmin+qround+cadd``: the pair's last multiply becomes the zero point's add, or
the four steps are appended when its readers only quantize) and writes uint8; its readers
take the bytes. The values are those of the float32 graph: a reader's quantization of the
pair's output gives back the pair's integers, and a residual dequantized from them is the
pair's output.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tunecache.compiler.codegen.epilogue import CHANNEL_OPERAND
from tunecache.compiler.graph import KernelNode
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.lowering import StepContext, readers, register_step_pass
from tunecache.compiler.lowering.dead import drop_unread
from tunecache.compiler.ops import OpSignature

__all__ = ["QDQ_TAIL", "pair_grid", "uint8_activations"]

QDQ_TAIL = ("cdiv", "cmax", "cmin", "qround", "cmul")
"""A quantize-dequantize pair folded into an epilogue (its rows: scale, low, high, scale)."""
QUANTIZE_TAIL = ("cdiv", "cmax", "cmin", "qround", "cadd")
"""The same quantizer ending in uint8 (its rows: scale, -zero, 255 - zero, zero)."""


@dataclass(frozen=True)
class _Quantizer:
    """A per-tensor uint8 quantizer: ``q = clamp(round(x / scale), -zero, 255 - zero) +
    zero``."""

    scale: np.float32
    zero: float


@register_step_pass
def uint8_activations(steps: list[Any], ctx: StepContext) -> list[Any]:
    """``steps`` with every activation whose writer and readers all take uint8 held so
    (unread steps dropped first: a pair an int8 kernel spared still reads its source)."""
    steps = drop_unread(steps, ctx)
    # A rewrite changes only constant inputs, so who reads each activation stays as it was.
    read = readers(steps)
    for position in range(len(steps)):
        rewritten = _rewrite(position, steps, read, ctx)
        if rewritten is not None:
            for at, node in rewritten.items():
                steps[at] = node
    return steps


def _rewrite(position: int, steps: list[Any], read: dict[str, list[int]],
             ctx: StepContext) -> dict[int, KernelNode] | None:
    """The writer at ``position`` and its readers rewritten to pass its output as uint8
    (by position), or None where one of them cannot."""
    writer = steps[position]
    if not isinstance(writer, KernelNode) or ctx.is_graph_output(writer.output):
        return None
    users = read.get(writer.output, [])
    roles = [_role(steps[at], writer.output) for at in users]  # None for a step reading it twice
    if roles == ["through"]:
        return _rewrite_through(position, users[0], steps, read, ctx)
    if not users or None in roles or "through" in roles:
        return None
    tail = _pair_quantizer(writer, ctx)
    quantizing = {_argument(steps[at], "qa", ctx) for at, role in zip(users, roles, strict=True)
                  if role == "x"}
    wanted = {_Quantizer(np.float32(q[0]), float(q[1])) for q in quantizing if q is not None}
    if len(wanted) > 1 or len(wanted) != len(quantizing) or (tail is None and (
            not wanted or "add" in roles or "xq" in roles)) or (
            tail is not None and wanted - {tail}):
        return None
    quantizer = tail if tail is not None else wanted.pop()
    if not _whole_zero(quantizer):
        return None
    made = _writer(writer, quantizer, tail is not None, ctx)
    readers = _readers(steps, users, roles, writer.output, quantizer, ctx)
    return None if made is None or readers is None else {position: made, **readers}


def _whole_zero(quantizer: _Quantizer) -> bool:
    """Whether ``quantizer``'s zero point is a whole number of uint8's range."""
    return 0.0 <= quantizer.zero <= 255.0 and quantizer.zero == round(quantizer.zero)


def _readers(steps: list[Any], users: list[int], roles: list[str | None], tensor: str,
             quantizer: _Quantizer, ctx: StepContext) -> dict[int, KernelNode] | None:
    """The readers at ``users`` taking ``tensor`` as uint8 of ``quantizer`` in their
    ``roles`` (by position), or None where one cannot."""
    out = {}
    for at, role in zip(users, roles, strict=True):
        node = None if role is None else _reader(steps[at], role, tensor, quantizer, ctx)
        if node is None:
            return None
        out[at] = node
    return out


def _role(step: Any, tensor: str) -> str | None:
    """How ``step`` reads ``tensor`` where it could take it as uint8: ``x`` (the input it
    quantizes with ``qa``), ``add`` (its residual), ``through`` (a float32 kernel that, given
    X and Y as uint8, becomes an int8 one handing the values on: a max pool), ``xq`` (a
    float32 kernel's input, which it would dequantize with ``xq``), else None."""
    to_narrow = op_kind(step.op.kind).with_narrow if isinstance(step, KernelNode) else None
    if to_narrow is None or step.inputs.count(tensor) != 1:
        return None
    name = _argument_names(step.op)[step.inputs.index(tensor)]
    if name == "add" or (name == "X" and "qa" in _argument_names(step.op)):
        return "add" if name == "add" else "x"
    if name != "X" or step.op.dtype != "float32":
        return None
    passed = to_narrow(step.op, frozenset({"x", "y"}))
    return "through" if passed is not None and passed.dtype == "int8" else "xq"


def _rewrite_through(position: int, at: int, steps: list[Any], read: dict[str, list[int]],
                     ctx: StepContext) -> dict[int, KernelNode] | None:
    """The writer at ``position``, its one reader at ``at`` that hands the values on (a max
    pool) and that one's readers rewritten to pass uint8 of one quantizer: the writer's
    pair's, which every reader after the pool quantizes with; or None."""
    through = steps[at]
    writer = steps[position]
    tail = _pair_quantizer(writer, ctx)
    users = read.get(through.output, [])
    roles = [_role(steps[u], through.output) for u in users]
    if tail is None or ctx.is_graph_output(through.output) or not users or \
            any(role not in ("x", "add") for role in roles):
        return None
    wanted = {_argument(steps[u], "qa", ctx) for u, role in zip(users, roles, strict=True)
              if role == "x"}
    if any(q is None or _Quantizer(np.float32(q[0]), float(q[1])) != tail for q in wanted):
        return None
    if not _whole_zero(tail):
        return None
    to_narrow = op_kind(through.op.kind).with_narrow
    made = _writer(writer, tail, True, ctx)
    passed = None if to_narrow is None else to_narrow(through.op, frozenset({"x", "y"}))
    readers = _readers(steps, users, roles, through.output, tail, ctx)
    if made is None or passed is None or readers is None:
        return None
    return {position: made, at: replace(through, op=passed), **readers}


def _argument_names(op: OpSignature) -> list[str]:
    return [a.name for a in op.arguments() if a.role == "input"]


def _argument(step: KernelNode, name: str, ctx: StepContext) -> tuple[float, ...] | None:
    """The constant ``step`` passes as its argument ``name``, flattened, or None."""
    value = ctx.constants.get(step.inputs[_argument_names(step.op).index(name)])
    return None if value is None else tuple(float(v) for v in np.asarray(value).reshape(-1))


def pair_grid(writer: KernelNode, ctx: StepContext) -> tuple[float, float, float] | None:
    """``(scale, low, high)`` of the quantize-dequantize pair ending ``writer``'s epilogue,
    the same in every channel, or None."""
    if writer.op.epilogue[-len(QDQ_TAIL):] != QDQ_TAIL:
        return None
    chan = ctx.constants.get(writer.inputs[_argument_names(writer.op).index(CHANNEL_OPERAND)])
    if chan is None:
        return None
    rows = np.asarray(chan, np.float32)[-4:]
    if not (rows == rows[:, :1]).all():
        return None
    scale, low, high, again = (float(v) for v in rows[:, 0])
    return (scale, low, high) if scale == again and scale > 0 else None


def _pair_quantizer(writer: KernelNode, ctx: StepContext) -> _Quantizer | None:
    """The uint8 quantizer whose quantize-dequantize pair ends ``writer``'s epilogue, or
    None."""
    grid = pair_grid(writer, ctx)
    if grid is None or grid[2] - grid[1] != 255.0:
        return None
    return _Quantizer(np.float32(grid[0]), -grid[1])


def _writer(writer: KernelNode, quantizer: _Quantizer, paired: bool,
            ctx: StepContext) -> KernelNode | None:
    """``writer`` ending its epilogue with ``quantizer`` (its pair's last multiply turned
    into the zero point's add, or the quantizer appended) and writing uint8."""
    names = _argument_names(writer.op)
    chan_at = names.index(CHANNEL_OPERAND) if CHANNEL_OPERAND in names else None
    view_of = op_kind(writer.op.kind).channel_view
    view = view_of(writer.op) if view_of is not None else None
    channels = view.channels if view is not None else None
    old = ctx.constants[writer.inputs[chan_at]] if chan_at is not None else None
    if paired:
        epilogue = writer.op.epilogue[:-len(QDQ_TAIL)] + QUANTIZE_TAIL
    elif channels is not None:
        epilogue = writer.op.epilogue + QUANTIZE_TAIL
    else:
        return None
    op = _with_narrow(writer.op, epilogue, "y")
    if op is None or (old is None and paired):
        return None
    s, z = quantizer.scale, quantizer.zero
    sources = () if old is None else (old,)
    chan = ctx.derived_constant(
        f"{writer.name}_u8", ("u8 quantizer", paired, float(s), z), sources,
        lambda: _quantizer_rows(old, paired, s, z, channels))
    inputs = list(writer.inputs)
    if chan_at is not None:
        inputs[chan_at] = chan
    else:  # where the op's arguments take the rows (before a uint8 X's xq)
        inputs.insert(_argument_names(op).index(CHANNEL_OPERAND), chan)
    return replace(writer, op=op, inputs=tuple(inputs))


def _quantizer_rows(old: np.ndarray | None, paired: bool, scale: np.float32, zero: float,
                    channels: int | None) -> np.ndarray:
    """The chain rows for the uint8 writer: the pair's last row the zero point, or four
    rows of the quantizer appended."""
    if paired:
        assert old is not None
        rows = np.array(old, dtype=np.float32)
        rows[-1] = zero
        return rows
    assert channels is not None
    added = np.array([[scale], [-zero], [255.0 - zero], [zero]], np.float32) * np.ones(
        (1, channels), np.float32)
    return added if old is None else np.concatenate([np.asarray(old, np.float32), added])


def _reader(step: KernelNode, role: str, tensor: str, quantizer: _Quantizer,
            ctx: StepContext) -> KernelNode | None:
    """``step`` taking ``tensor`` as uint8 in ``role``; a residual with its ``aq``, a float32
    kernel's input with its ``xq``."""
    op = _with_narrow(step.op, step.op.epilogue, "x" if role == "xq" else role)
    if op is None:
        return None
    inputs = list(step.inputs)
    if role == "xq":
        s, z = float(quantizer.scale), quantizer.zero
        xq = ctx.derived_constant(f"{step.name}_xq", ("u8 dequantizer", s, z), (),
                                  lambda: np.array([s, z], np.float32))
        inputs.insert(_argument_names(op).index("xq"), xq)
        return replace(step, op=op, inputs=tuple(inputs))
    if role == "add":
        s, z = float(quantizer.scale), quantizer.zero
        aq = ctx.derived_constant(f"{step.name}_aq", ("u8 dequantizer", s, z), (),
                                  lambda: np.array([s, z], np.float32))
        inputs.insert(inputs.index(tensor) + 1, aq)
    return replace(step, op=op, inputs=tuple(inputs))


def _with_narrow(op: OpSignature, epilogue: tuple[str, ...], role: str) -> OpSignature | None:
    """``op`` with ``epilogue``, holding ``role``'s tensor as uint8, or None."""
    to_u8 = op_kind(op.kind).with_narrow
    if to_u8 is None:
        return None
    try:
        return to_u8(OpSignature(op.kind, op.dims, op.dtype, op.attrs, epilogue),
                     frozenset({role}))
    except ValueError:
        return None
