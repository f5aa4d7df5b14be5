"""Fused epilogues: an op's ordered epilogue steps rendered into C by one function.

An epilogue is the tuple of step names an op carries (``op.epilogue``, e.g.
``("bias", "add", "relu")``), applied in that order to every output element once its
reduction is complete. Each step is one :class:`Step` of :data:`STEPS`: the new value of
``{x}`` as a vector expression (the ``V*`` macros of ``isa.py``), a C statement updating a
float ``{x}`` in place, and the same step in numpy (for the kinds' references); a step with
an operand reads ``{y}``, an element or vector of the tensor it names.
:func:`render` turns the steps into C statements on one variable; the caller says where each
operand tensor's element is (a C expression per tensor name), so the same table serves
register tiles (vector C), edge and merge loops (scalar C) and elementwise kernels::

    render(("bias", "relu"), "t", {"bias": "VLOADU(bias + j)"}, vector=True)
    # -> "t = VADD(t, VLOADU(bias + j)); t = VRELU(t);"
    render(("bias", "relu"), "v", {"bias": "bias[j]"}, vector=False)
    # -> "v += bias[j]; if (v < 0.0f) v = 0.0f;"

The activations ``relu``, ``clip6`` (ReLU6), ``silu`` (``x * sigmoid(x)``) and the two
GELUs (``gelu_erf``, ``gelu_tanh``) are the ``elementwise`` kind's steps of the same names
too: that kind takes their vector and numpy forms from here, so each is defined once.
The **channel chain** steps ``cadd, csub, cmul, cdiv, cmax, cmin`` (``v = v op c``, with
``c`` one value per output channel) and ``qround`` (a quantizer's rounding) are an
element-wise chain (the ``elementwise`` kind's steps of the same names without the ``c``)
folded into a producer's epilogue (:mod:`tunecache.compiler.lowering.chains`): every
channel step reads its own row of the one operand tensor ``chan`` (``[steps, channels]``),
in order, so the caller gives ``chan`` as a template with ``{i}`` for the row.
Adding a step is one entry here (plus any vector helper it needs in ``isa.py``, any scalar
one in ``isa.SCALAR_MATH`` named in ``helpers``, and the step in the kind's
``KindSpec.epilogues``); a step reading a tensor names it in ``operand``, the kind's
``arguments`` must list that tensor and each emitter passes its addressing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
from scipy import special

from tunecache.compiler.codegen.isa import SCALAR_MATH

__all__ = ["CHAIN_STEPS", "CHANNEL_OPERAND", "CHANNEL_STEPS", "RESIDUAL_STEP", "STEPS", "Step",
           "chain_rows", "operand_tensors", "reference", "render", "scalar_helpers"]


@dataclass(frozen=True, slots=True)
class Step:
    """One epilogue step. ``vector``: the step's result as a ``vec`` expression of ``{x}``
    (and ``{y}``); ``scalar``: a C statement updating the ``float`` variable ``{x}`` in
    place; ``numpy``: the step on a float array ``numpy(x)``, or ``numpy(x, y)`` with the
    operand broadcast to it, writing into ``x`` where it can. ``operand`` names the tensor
    ``{y}`` reads. Scalar forms are statements: they keep the exact C the kernels were tuned
    with (``if`` for relu compiles differently from a ``?:``)."""

    vector: str
    scalar: str
    numpy: Callable[..., np.ndarray]
    operand: str | None = None
    helpers: tuple[str, ...] = ()
    """Scalar C functions the scalar form calls that the prelude lacks (``isa.SCALAR_MATH``)."""


def _binary(ufunc: np.ufunc) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``ufunc(x, y)`` written into ``x``."""
    return lambda x, y: ufunc(x, y, out=x)


SQRT1_2 = 0.7071067811865476
GELU_TANH_C = 0.7978845608028654  # sqrt(2/pi)


def _mish(x: np.ndarray) -> np.ndarray:
    return np.multiply(x, np.tanh(np.logaddexp(x.dtype.type(0), x)), out=x)


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + special.erf(x * x.dtype.type(SQRT1_2)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(x.dtype.type(GELU_TANH_C) * (x + 0.044715 * x * x * x)))


SIXTH = "0.16666667"
"""1/6 as a float32 literal: HardSwish's and torch's HardSigmoid's slope."""
_HARD = "VADD(VMUL({x}, VSET1(" + SIXTH + "f)), VSET1(0.5f))"

QROUND_LIMIT = float(1 << 22)
"""``qround(v)`` rounds ``v`` saturated to ±2**22 to the nearest integer, ties to even: the
rounding of a quantizer, whose results saturate far inside that range anyway (exact there by
one add and subtract of 1.5 * 2**23)."""
CHANNEL_OPERAND = "chan"
"""The operand tensor of the channel chain steps: one row per step, one value per channel."""
_CHANNEL = {"cadd": ("VADD({x}, {y})", "{x} += {y};", np.add),
            "csub": ("VSUB({x}, {y})", "{x} -= {y};", np.subtract),
            "cmul": ("VMUL({x}, {y})", "{x} *= {y};", np.multiply),
            "cdiv": ("VDIV({x}, {y})", "{x} /= {y};", np.divide),
            # As the vector max/min: the second operand where the comparison fails (NaN).
            # The chains that clamp are quantize steps, which send NaN to the low end as
            # onnxruntime's QuantizeLinear does (an integer holds no NaN).
            "cmax": ("VMAX({x}, {y})", "{x} = {x} > {y} ? {x} : {y};", np.maximum),
            "cmin": ("VMIN({x}, {y})", "{x} = {x} < {y} ? {x} : {y};", np.minimum)}
CHANNEL_STEPS = tuple(_CHANNEL)
"""The steps reading a row of :data:`CHANNEL_OPERAND`."""
CHAIN_STEPS = MappingProxyType({"add": "cadd", "sub": "csub", "mul": "cmul", "div": "cdiv",
                                "max": "cmax", "min": "cmin", "qround": "qround",
                                "relu": "relu", "clip6": "clip6"})
"""The element-wise chain steps a producer's epilogue can take, by their chain name."""
RESIDUAL_STEP = "radd"
"""A residual added within a chain (a quantized network adds its branches after the
quantize-dequantize pair of each): ``add``'s operand, where the ordered epilogue's ``add``
would come too early."""


STEPS: Mapping[str, Step] = MappingProxyType({
    "bias": Step(vector="VADD({x}, {y})", scalar="{x} += {y};", numpy=_binary(np.add),
                 operand="bias"),
    "add": Step(vector="VADD({x}, {y})", scalar="{x} += {y};", numpy=_binary(np.add),
                operand="add"),
    RESIDUAL_STEP: Step(vector="VADD({x}, {y})", scalar="{x} += {y};", numpy=_binary(np.add),
                        operand="add"),
    # NaN stays NaN (as in onnxruntime's Relu and Clip): the vector max and min return their
    # second operand when either is NaN, so the value goes second.
    "relu": Step(vector="VRELU({x})", scalar="if ({x} < 0.0f) {x} = 0.0f;",
                 numpy=lambda x: np.maximum(x, 0, out=x)),
    "clip6": Step(vector="VMIN(VSET1(6.0f), VMAX(VZERO(), {x}))",
                  scalar="{x} = {x} < 0.0f ? 0.0f : ({x} > 6.0f ? 6.0f : {x});",
                  numpy=lambda x: np.clip(x, 0, 6, out=x)),
    # x / (1 + e**-x): one division, no separate sigmoid; FEXP is VEXP's scalar twin.
    "silu": Step(vector="VDIV({x}, VADD(VSET1(1.0f), VEXP(VNEG({x}))))",
                 scalar="{x} = {x} / (1.0f + FEXP(-{x}));",
                 numpy=lambda x: np.multiply(x, special.expit(x), out=x)),
    # GELU as exported: 0.5 x (1 + erf(x / sqrt 2)), and the tanh approximation (GPT-2).
    "gelu_erf": Step(
        vector="VGELU_ERF({x})",
        scalar=f"{{x}} = 0.5f * {{x}} * (1.0f + FERF({{x}} * {SQRT1_2}f));",
        numpy=_gelu_erf, helpers=("FERF",)),
    "gelu_tanh": Step(
        vector=f"VMUL(VMUL(VSET1(0.5f), {{x}}), VADD(VSET1(1.0f), VTANH(VMUL(VSET1("
               f"{GELU_TANH_C}f), VFMA(VMUL(VSET1(0.044715f), {{x}}), VMUL({{x}}, {{x}}), "
               f"{{x}})))))",
        scalar=f"{{x}} = 0.5f * {{x}} * (1.0f + FTANH({GELU_TANH_C}f * ({{x}} + 0.044715f "
               f"* {{x}} * {{x}} * {{x}})));",
        numpy=_gelu_tanh, helpers=("FTANH",)),
    # HardSwish x * clamp(x / 6 + 1/2, 0, 1) and torch's HardSigmoid clamp(x / 6 + 1/2, 0, 1)
    # (MobileNet-v3's); a NaN stays NaN (it goes second to the vector max and min, and the
    # scalar comparisons fail).
    "hardswish": Step(
        vector=f"VMUL({{x}}, VMIN(VSET1(1.0f), VMAX(VZERO(), {_HARD.format(x='{x}')})))",
        scalar="{{ float t = {x} * " + SIXTH + "f + 0.5f; "
               "t = t < 0.0f ? 0.0f : (t > 1.0f ? 1.0f : t); {x} *= t; }}",
        numpy=lambda x: np.multiply(x, np.clip(x * x.dtype.type(1 / 6) + 0.5, 0, 1), out=x)),
    "hardsigmoid": Step(
        vector=f"VMIN(VSET1(1.0f), VMAX(VZERO(), {_HARD.format(x='{x}')}))",
        scalar="{x} = {x} * " + SIXTH + "f + 0.5f; "
               "{x} = {x} < 0.0f ? 0.0f : ({x} > 1.0f ? 1.0f : {x});",
        numpy=lambda x: np.clip(np.multiply(x, x.dtype.type(1 / 6), out=x) + 0.5, 0, 1,
                                out=x)),
    # Mish (YOLOv4's), x * tanh(softplus(x)): isa.SCALAR_MATH's FMISH and VMISH.
    "mish": Step(vector="VMISH({x})", scalar="{x} = FMISH({x});", numpy=_mish,
                 helpers=("FMISH", "VMISH")),
    # An integer accumulator as the float it stands for: times its column's scale (an int8
    # matmul's A scale times B's per-column scale); zero-point terms are folded into bias.
    "dequant": Step(vector="VMUL({x}, {y})", scalar="{x} *= {y};",
                    numpy=_binary(np.multiply), operand="scale"),
    "qround": Step(
        vector="VSUB(VADD(VMIN(VMAX({x}, VSET1(-4194304.0f)), VSET1(4194304.0f)), "
               "VSET1(12582912.0f)), VSET1(12582912.0f))",
        scalar="{x} = ({x} < -4194304.0f ? -4194304.0f : ({x} > 4194304.0f ? 4194304.0f : "
               "{x})) + 12582912.0f - 12582912.0f;",
        numpy=lambda x: np.rint(np.clip(x, -QROUND_LIMIT, QROUND_LIMIT, out=x), out=x)),
    **{name: Step(vector=v, scalar=c, numpy=_binary(f), operand=CHANNEL_OPERAND)
       for name, (v, c, f) in _CHANNEL.items()},
})
"""Every epilogue step a kernel can fuse, by name."""


def _step(name: str) -> Step:
    try:
        return STEPS[name]
    except KeyError:
        raise ValueError(f"unknown epilogue step {name!r}; known steps: {', '.join(STEPS)}") from None


def scalar_helpers(steps: Sequence[str]) -> str:
    """C of the scalar helpers ``steps``' scalar forms call (empty for most epilogues): a
    kernel rendering scalar epilogues places it after the prelude."""
    names = dict.fromkeys(h for step in steps for h in _step(step).helpers)
    return "".join(SCALAR_MATH[name] for name in names)


def operand_tensors(steps: Sequence[str]) -> tuple[str, ...]:
    """The tensors ``steps`` read, in step order (each once): the operands :func:`render`
    needs."""
    return tuple(dict.fromkeys(op for op in (_step(name).operand for name in steps)
                               if op is not None))


def chain_rows(steps: Sequence[str]) -> int:
    """How many rows of :data:`CHANNEL_OPERAND` ``steps`` read (one per channel step)."""
    return sum(_step(name).operand == CHANNEL_OPERAND for name in steps)


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
    row = 0
    for name in steps:
        step = _step(name)
        y = ""
        if step.operand is not None:
            if step.operand not in operands:
                raise ValueError(f"epilogue step {name!r} reads tensor {step.operand!r}, but the "
                                 f"emitter gave only {', '.join(operands) or 'no operands'}")
            y = operands[step.operand]
            if step.operand == CHANNEL_OPERAND:
                y, row = y.replace("{i}", str(row)), row + 1
        if vector:
            out.append(f"{value} = {step.vector.format(x=value, y=y)};")
        else:
            out.append(step.scalar.format(x=value, y=y))
    return " ".join(out)


def reference(steps: Sequence[str], value: np.ndarray,
              operands: Mapping[str, np.ndarray]) -> np.ndarray:
    """``steps`` applied in order to the float array ``value`` in numpy (in place where the
    dtype allows); ``operands`` maps a tensor name to an array broadcasting to ``value``
    (:data:`CHANNEL_OPERAND`: its rows, in a leading axis, each broadcasting to ``value``)."""
    row = 0
    for name in steps:
        step = _step(name)
        if step.operand is None:
            value = step.numpy(value)
        elif step.operand not in operands:
            raise ValueError(f"epilogue step {name!r} reads tensor {step.operand!r}, but the "
                             f"reference got only {', '.join(operands) or 'no operands'}")
        elif step.operand == CHANNEL_OPERAND:
            value, row = step.numpy(value, operands[step.operand][row]), row + 1
        else:
            value = step.numpy(value, operands[step.operand])
    return value
