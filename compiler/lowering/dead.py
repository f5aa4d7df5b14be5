"""The last step pass: steps whose outputs nothing reads are dropped.

A lowering that reads a pattern's input itself (an int8 kernel reading the float32 tensor a
quantize-dequantize pair was computed from, :mod:`.quantized`) leaves the pattern's other
nodes unread; every step is a pure function of its inputs, so they go, repeatedly, until
each step left feeds another or the graph's outputs. Registered last (``dead`` ends
:data:`~tunecache.compiler.lowering.BUILTIN_LOWERINGS`), after every pass that rewires steps.
"""

from __future__ import annotations

from typing import Any

from tunecache.compiler.graph import OnnxNode
from tunecache.compiler.lowering import StepContext, readers, register_step_pass

__all__ = ["drop_unread"]


def _written(step: Any) -> tuple[str, ...]:
    return tuple(o for o in step.outputs if o) if isinstance(step, OnnxNode) else (step.output,)


@register_step_pass
def drop_unread(steps: list[Any], ctx: StepContext) -> list[Any]:
    """``steps`` without those whose outputs no step reads and the graph does not return."""
    while True:
        read = readers(steps)
        kept = [s for s in steps if any(o in read or ctx.is_graph_output(o)
                                        for o in _written(s))]
        if len(kept) == len(steps):
            return kept
        steps = kept


