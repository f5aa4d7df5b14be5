"""A step pass: runs of per-channel multiplies and adds in an epilogue become one of each.

A quantized network that was not pre-processed leaves each int8 kernel's epilogue a long
chain (:mod:`.chains`, :mod:`.u8`): the accumulator's dequantization and bias, a divide by
the next quantizer's scale, its clamps and rounding, a multiply back, a BatchNormalization's
multiply and add, a divide by the next scale, ... Between two non-linear steps (a clamp, a
rounding, an activation) every step is ``v * a + b`` per channel, and a run of them is one:
composed in float64 at compile time, it runs as one multiply and one add (as ``dequant``
and ``bias`` where the run starts the epilogue). ResNet-50's int8 bottleneck epilogues
drop from 20 steps to 12, and epilogues were most of those kernels' time (a 1x1 64->256 on
AMX: 0.30 ms with ``dequant+bias``, 0.69 with its 15 steps).

A uint8 residual (``radd`` with ``aq``) joins a run when the steps after it scale every
channel alike: the scale goes into ``aq``. The composed run rounds once or twice where the
chain rounded at every step, so a value that lands within a float32 rounding of a
quantizer's rounding tie may round the other way: an output one quantization step from
onnxruntime's, which runs the steps one by one (the int8 bar allows one step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from tunecache.compiler.codegen.epilogue import CHANNEL_OPERAND, RESIDUAL_STEP, STEPS
from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.graph import KernelNode
from tunecache.compiler.lowering import StepContext, register_step_pass
from tunecache.compiler.ops import OpSignature

__all__ = ["compose_affine_runs"]

_MULTIPLY = ("cmul", "cdiv")
_ADD = ("cadd", "csub")
HEAD = ("dequant", "bias")
"""An int8 kernel's epilogue head: a run starting there keeps these two steps' forms."""
HEAD_ARGS = ("scale", "bias")
"""The head steps' operands."""


@dataclass
class _Run:
    """``v * a + b`` per channel (float64), plus ``k`` times a uint8 residual when it
    passed ``radd``: the steps composed so far."""

    a: np.ndarray
    b: np.ndarray
    steps: int = 0
    multiplies: bool = False
    adds: bool = False
    residual: float | None = None


@register_step_pass
def compose_affine_runs(steps: list[Any], ctx: StepContext) -> list[Any]:
    """``steps`` with every kernel's affine epilogue runs composed (see the module doc)."""
    return [_composed(step, ctx) or step if isinstance(step, KernelNode) else step
            for step in steps]


def _composed(step: KernelNode, ctx: StepContext) -> KernelNode | None:
    """``step`` with its epilogue's runs composed, or None when nothing shortens."""
    names = [a.name for a in step.op.arguments() if a.role == "input"]
    if CHANNEL_OPERAND not in names:
        return None
    args = dict(zip(names, step.inputs, strict=True))
    if any(args[n] not in ctx.constants for n in (CHANNEL_OPERAND, *HEAD_ARGS) if n in args):
        return None
    rows = iter(np.asarray(ctx.constants[args[CHANNEL_OPERAND]], np.float64))
    channels = int(np.asarray(ctx.constants[args[CHANNEL_OPERAND]]).shape[-1])
    operands = {n: np.asarray(ctx.constants[args[n]], np.float64).reshape(-1)
                for n in HEAD_ARGS if n in args}
    aq = _constant(ctx, args.get("aq"))
    epilogue, kept, head, scale = _fold(step.op.epilogue, rows, operands, channels,
                                        aq is not None)
    if len(epilogue) >= len(step.op.epilogue):
        return None
    try:
        op = OpSignature(step.op.kind, step.op.dims, step.op.dtype, step.op.attrs, epilogue)
    except OpSignatureError:
        return None
    sources = tuple(ctx.constants[args[n]] for n in (*HEAD_ARGS, CHANNEL_OPERAND, "aq")
                    if n in args)
    values = dict(head)
    if kept:
        values[CHANNEL_OPERAND] = np.stack(kept)
    if aq is not None and scale != 1.0:
        values["aq"] = np.array([aq[0] * scale, aq[1]])
    made = {n: ctx.derived_constant(f"{step.name}_{n}", ("affine", n, step.op.epilogue),
                                    sources, partial(_same, v))
            for n, v in values.items()}
    new = [a.name for a in op.arguments() if a.role == "input"]
    return replace(step, op=op, inputs=tuple(made.get(n, args.get(n, "")) for n in new))


def _same(value: np.ndarray) -> np.ndarray:
    return value


def _constant(ctx: StepContext, name: str | None) -> np.ndarray | None:
    return None if name is None or name not in ctx.constants else \
        np.asarray(ctx.constants[name], np.float64).reshape(-1)


def _fold(epilogue: Sequence[str], rows: Any, head: dict[str, np.ndarray], channels: int,
          scalable_residual: bool
          ) -> tuple[tuple[str, ...], list[np.ndarray], dict[str, np.ndarray], float]:
    """The composed epilogue, its chain rows, the head's new operands and the uint8
    residual's scale factor."""
    out: list[str] = []
    kept: list[np.ndarray] = []
    new_head: dict[str, np.ndarray] = {}
    factor = 1.0
    run = _Run(np.ones(channels), np.zeros(channels))
    starts_head = tuple(epilogue[:2]) == HEAD
    for i, name in enumerate(epilogue):
        row: np.ndarray | None = head[HEAD_ARGS[i]] if starts_head and i < 2 else (
            next(rows) if STEPS[name].operand == CHANNEL_OPERAND else None)
        affine = (starts_head and i < 2) or name in _MULTIPLY or name in _ADD
        if affine and row is not None and name in _MULTIPLY and run.residual is not None \
                and not np.all(row == row[0]):
            # channels scaled differently would scale the residual per channel: a new run
            factor = _flush(run, out, kept, new_head, starts_head and not out, factor)
            run = _Run(np.ones(channels), np.zeros(channels))
        if affine and row is not None:
            _apply(run, name, row)
        elif name == RESIDUAL_STEP and scalable_residual and run.residual is None:
            run.residual = 1.0
        else:
            factor = _flush(run, out, kept, new_head, starts_head and not out, factor)
            run = _Run(np.ones(channels), np.zeros(channels))
            out.append(name)
            if row is not None:
                kept.append(row)
    factor = _flush(run, out, kept, new_head, starts_head and not out, factor)
    return tuple(out), kept, new_head, factor


def _apply(run: _Run, name: str, row: np.ndarray) -> None:
    """``run`` followed by step ``name`` with operand ``row``."""
    if name in ("dequant", "cmul", "cdiv"):
        c = row if name != "cdiv" else 1.0 / row
        run.a, run.b = run.a * c, run.b * c
        run.multiplies = True
        if run.residual is not None:
            run.residual *= float(c[0])
    else:
        run.b = run.b + (-row if name == "csub" else row)
        run.adds = True
    run.steps += 1


def _flush(run: _Run, out: list[str], kept: list[np.ndarray], head: dict[str, np.ndarray],
           at_head: bool, factor: float) -> float:
    """Append ``run`` composed: the head's two steps at the head, else a multiply and an
    add (only the one it needs). Returns the uint8 residual's scale factor."""
    if at_head and run.steps:
        head["scale"], head["bias"] = run.a, run.b
        out.extend(HEAD)
    elif run.steps:
        for name, row, wanted in (("cmul", run.a, run.multiplies), ("cadd", run.b, run.adds)):
            if wanted:
                out.append(name)
                kept.append(row)
    if run.residual is not None:
        out.append(RESIDUAL_STEP)
        return run.residual
    return factor
