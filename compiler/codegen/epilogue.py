"""Fused epilogues: an op's ordered epilogue steps rendered into C by one function.

An epilogue is the tuple of step names an op carries (``op.epilogue``, e.g.
``("bias", "add", "relu")``), applied in that order to every output element once its
reduction is complete. Each step is one :class:`Step` of :data:`STEPS`: a C statement updating
the value ``{x}`` in place, once for a vector (the ``V*`` macros of ``isa.py``) and once for a
float, reading ``{y}`` (an element or vector of the tensor it names) when it has an operand.
:func:`render` turns the steps into C statements on one variable; the caller says where each
operand tensor's element is (a C expression per tensor name), so the same table serves
register tiles (vector C), edge and merge loops (scalar C) and elementwise kernels::

    render(("bias", "relu"), "t", {"bias": "VLOADU(bias + j)"}, vector=True)
    # -> "t = VADD(t, VLOADU(bias + j)); t = VRELU(t);"
    render(("bias", "relu"), "v", {"bias": "bias[j]"}, vector=False)
    # -> "v += bias[j]; if (v < 0.0f) v = 0.0f;"

Adding a step is one entry here (plus any vector helper it needs in ``isa.py``, and the step
in the kind's ``KindSpec.epilogues`` and reference), e.g. ReLU6::

    "clip": Step(vector="{x} = VMIN(VMAX({x}, VZERO()), VSET1(6.0f));",
                 scalar="{x} = fminf(fmaxf({x}, 0.0f), 6.0f);"),

and ``sigmoid``/``silu``/``gelu`` likewise, their vector form calling an ``isa.py`` helper
(``VEXP``, ``VTANH``, ``VERF``). A step reading a tensor names it in ``operand``; the kind's
``arguments`` must list that tensor and each emitter passes its addressing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["STEPS", "Step", "operand_tensors", "render"]


@dataclass(frozen=True, slots=True)
class Step:
    """One epilogue step: ``vector`` and ``scalar`` C statements updating ``{x}`` (a ``vec``
    or a ``float`` variable) in place, reading ``{y}`` (that tensor's vector or element) when
    ``operand`` names a tensor. Statements, not expressions: the scalar forms keep the exact
    C the kernels were tuned with (``if`` for relu compiles differently from a ``?:``)."""

    vector: str
    scalar: str
    operand: str | None = None


STEPS: Mapping[str, Step] = MappingProxyType({
    "bias": Step(vector="{x} = VADD({x}, {y});", scalar="{x} += {y};", operand="bias"),
    "add": Step(vector="{x} = VADD({x}, {y});", scalar="{x} += {y};", operand="add"),
    # Scalar relu keeps -0.0 and NaN as the kernels always have (the vector max does not).
    "relu": Step(vector="{x} = VRELU({x});", scalar="if ({x} < 0.0f) {x} = 0.0f;"),
})
"""Every epilogue step a kernel can fuse, by name."""


def _step(name: str) -> Step:
    try:
        return STEPS[name]
    except KeyError:
        raise ValueError(f"unknown epilogue step {name!r}; known steps: {', '.join(STEPS)}") from None


def operand_tensors(steps: Sequence[str]) -> tuple[str, ...]:
    """The tensors ``steps`` read, in step order: the operands :func:`render` needs."""
    return tuple(op for op in (_step(name).operand for name in steps) if op is not None)


def render(steps: Sequence[str], value: str, operands: Mapping[str, str], *,
           vector: bool) -> str:
    """C statements applying ``steps`` in order to the variable ``value`` (a ``vec`` when
    ``vector``, else a ``float``); empty when there are no steps.

    ``operands`` maps a tensor name to the C expression of its element at the value's
    position (a ``vec`` expression for vector C; a step's operand is one term, so give
    compound expressions in parentheses); names no step reads are ignored, so an emitter can
    pass every operand it knows.
    """
    out = []
    for name in steps:
        step = _step(name)
        y = ""
        if step.operand is not None:
            if step.operand not in operands:
                raise ValueError(f"epilogue step {name!r} reads tensor {step.operand!r}, but the "
                                 f"emitter gave only {', '.join(operands) or 'no operands'}")
            y = operands[step.operand]
        out.append((step.vector if vector else step.scalar).format(x=value, y=y))
    return " ".join(out)
