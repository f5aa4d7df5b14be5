"""A step pass: a quantize-dequantize pair on values already on its grid is dropped.

``onnxruntime.quantization`` puts a pair after every node it quantizes around, and after
the data-movement nodes between them: a QDQ BERT's query projection ends with a pair, then
reshapes its output and quantizes it again with the same scale, then transposes it and
quantizes it a third time (7 such pairs a layer, 2.0 ms of BERT-base's 46). A pair maps
every value already on its grid (``(q - z) * s`` for an integer ``q`` in its range) to
itself, and moving values keeps them on the grid; so a pair whose input was last
quantized by a pair of the same scale and range, through nothing but data movement, becomes
an ``Identity`` view. Exactly: the
pair's division gives back the integer the earlier one multiplied, whatever the rounding
of that product (|q| <= 255 is far inside float32's precision).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tunecache.compiler.graph import KernelNode, OnnxNode
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.lowering import StepContext, producers, register_step_pass
from tunecache.compiler.lowering.u8 import QDQ_TAIL, pair_grid

__all__ = ["drop_repeated_pairs"]

PAIR = ("div", "max", "min", "qround", "mul")
"""An element-wise quantize-dequantize pair's steps (operands: scale, low, high, scale)."""
MOVES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose",
                   "MaxPool", "Dropout"})
"""ONNX nodes that move or select values without computing new ones."""


@register_step_pass
def drop_repeated_pairs(steps: list[Any], ctx: StepContext) -> list[Any]:
    """``steps`` with every pair on values already on its grid made an ``Identity``."""
    made = producers(steps)
    out = list(steps)
    for position, step in enumerate(steps):
        grid = _pair(step, ctx)
        if grid is not None and _grid_of(step.inputs[0], out, made, ctx) == grid:
            out[position] = OnnxNode(step.name, "Identity", (step.inputs[0],), (step.output,),
                                     {})
    return out


Grid = tuple[float, float, float]
"""A quantizer's ``(scale, low, high)``: its grid."""


def _pair(step: Any, ctx: StepContext) -> Grid | None:
    """The grid of ``step`` when it is an element-wise pair of scalar operands, else None."""
    if not isinstance(step, KernelNode):
        return None
    view_of = op_kind(step.op.kind).chain_view
    chain = view_of(step.op) if view_of is not None else None
    if chain is None or chain.steps != PAIR or chain.operand != "scalar":
        return None
    values = [ctx.constants.get(name) for name in step.inputs[1:5]]
    if any(v is None or np.asarray(v).size != 1 for v in values):
        return None
    scale, low, high, again = (float(np.asarray(v).reshape(-1)[0]) for v in values)
    return (scale, low, high) if scale == again and scale > 0 else None


def _grid_of(tensor: str, steps: list[Any], made: dict[str, int], ctx: StepContext
             ) -> Grid | None:
    """The grid ``tensor``'s values lie on, from the step that last quantized them."""
    for _ in range(len(steps)):
        at = made.get(tensor)
        if at is None:
            return None
        step = steps[at]
        if isinstance(step, OnnxNode):
            if step.op_type not in MOVES or not step.inputs:
                return None
            tensor = step.inputs[0]
            continue
        if step.op.epilogue[-len(QDQ_TAIL):] == QDQ_TAIL:
            return pair_grid(step, ctx)
        return _pair(step, ctx)
    return None
