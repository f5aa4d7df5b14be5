"""Elementwise ONNX ops: unary maths and activations, binary and variadic arithmetic,
comparisons and logic (numpy broadcasting), ``Where``, ``Clip``, ``Cast`` and ``Dropout``
(the identity at inference).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tunecache.compiler.onnx_ops.registry import (
    DECLINES,
    NUMPY_DTYPES,
    OPS,
    Array,
    OpImpl,
    as_array,
    opt_input,
    register,
)


def _unary(fn: Callable[[Array], Any]) -> OpImpl:
    def impl(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
        x = inputs[0]
        assert x is not None
        return [as_array(fn(x), x.dtype)]
    return impl


# Abramowitz & Stegun 7.1.26: erf(a) = 1 - t(p1 + t(p2 + ...)) e^(-a^2), t = 1 / (1 + 0.3275911 a)
_ERF_P = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(x: Array) -> Array:
    """erf; float32 by a rational approximation (absolute error below 1e-6, 4x faster
    than scipy's float32 erf on BERT's GELU), other dtypes by scipy."""
    if x.dtype != np.float32:
        from scipy.special import erf

        return np.asarray(erf(x))
    f = np.float32
    a = np.abs(x)
    t = a * f(0.3275911)
    t += f(1)
    np.reciprocal(t, out=t)
    y = t * f(_ERF_P[4])
    for coefficient in reversed(_ERF_P[:4]):
        y += f(coefficient)
        y *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    y *= a
    np.subtract(f(1), y, out=y)
    return np.copysign(y, x, out=y)


_UNARY: dict[str, Callable[[Array], Any]] = {
    "Relu": lambda x: np.maximum(x, x.dtype.type(0)),
    "Sqrt": np.sqrt, "Tanh": np.tanh, "Exp": np.exp, "Log": np.log, "Abs": np.abs,
    "Neg": np.negative, "Floor": np.floor, "Ceil": np.ceil, "Erf": _erf,
    "Reciprocal": lambda x: np.reciprocal(x) if x.dtype.kind == "f" else 1 // x,
    "Sigmoid": lambda x: np.reciprocal(x.dtype.type(1) + np.exp(-x)),
    "Not": np.logical_not,
    "Identity": lambda x: x,
    "Cos": np.cos, "Sin": np.sin, "Sign": np.sign,
}
for _name, _fn in _UNARY.items():
    OPS[_name] = _unary(_fn)


@register("IsNaN")
def _isnan(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    return [as_array(np.isnan(x))]


@register("IsInf")
def _isinf(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    positive, negative = int(attrs.get("detect_positive", 1)), int(attrs.get("detect_negative", 1))
    return [as_array(np.isinf(x) & (((x > 0) & bool(positive)) | ((x < 0) & bool(negative))))]


def _div(a: Array, b: Array) -> Array:
    if a.dtype.kind in "iu":
        # ONNX integer division truncates toward zero (C semantics), numpy's // floors.
        return np.trunc(np.true_divide(a, b)).astype(a.dtype)
    return np.true_divide(a, b)


_BINARY: dict[str, Callable[[Array, Array], Any]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _div,
    "Pow": np.power, "Equal": np.equal, "Less": np.less, "Greater": np.greater,
    "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal,
    "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
}


def _binary(name: str) -> OpImpl:
    fn = _BINARY[name]
    keeps_type = name in ("Add", "Sub", "Mul", "Div", "Pow")

    def impl(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        # Pow's result has the base's type; the other arithmetic ops have equal input types.
        return [as_array(fn(a, b), a.dtype if keeps_type else None)]
    return impl


for _name in _BINARY:
    OPS[_name] = _binary(_name)


@register("Mod")
def _mod(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    # fmod=1 (required for floats): the sign of the dividend, as C's fmod; else the divisor's.
    fn = np.fmod if attrs.get("fmod", 0) else np.mod
    return [as_array(fn(a, b), a.dtype)]


def _variadic(fn: Callable[[Array, Array], Any]) -> OpImpl:
    def impl(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
        arrays = [x for x in inputs if x is not None]
        out = arrays[0]
        for x in arrays[1:]:
            out = fn(out, x)
        return [as_array(out, arrays[0].dtype)]
    return impl


OPS["Sum"] = _variadic(np.add)
OPS["Max"] = _variadic(np.maximum)
OPS["Min"] = _variadic(np.minimum)


@register("Mean")
def _mean(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    arrays = [x for x in inputs if x is not None]
    total = OPS["Sum"](arrays, attrs, opset)[0]
    return [as_array(total / total.dtype.type(len(arrays)), arrays[0].dtype)]


@register("Where")
def _where(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    c, x, y = inputs
    assert c is not None and x is not None and y is not None
    return [as_array(np.where(c, x, y), x.dtype)]


@register("LeakyRelu")
def _leaky_relu(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    alpha = x.dtype.type(attrs.get("alpha", 0.01))
    return [as_array(np.where(x >= 0, x, x * alpha), x.dtype)]


@register("HardSigmoid")
def _hard_sigmoid(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                  opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    t = x.dtype.type
    y = np.clip(x * t(attrs.get("alpha", 0.2)) + t(attrs.get("beta", 0.5)), t(0), t(1))
    return [as_array(y, x.dtype)]


@register("HardSwish")
def _hard_swish(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    t = x.dtype.type
    return [as_array(x * np.clip(x / t(6) + t(0.5), t(0), t(1)), x.dtype)]


@register("Gelu")
def _gelu(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    t = x.dtype.type
    if attrs.get("approximate", "none") == "tanh":
        inner = t(math.sqrt(2 / math.pi)) * (x + t(0.044715) * x * x * x)
        return [as_array(t(0.5) * x * (t(1) + np.tanh(inner)), x.dtype)]
    return [as_array(t(0.5) * x * (t(1) + _erf(x / t(math.sqrt(2)))), x.dtype)]


@register("Clip")
def _clip(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    if opset < 11:
        lo: Any = attrs.get("min")
        hi: Any = attrs.get("max")
    else:
        lo, hi = opt_input(inputs, 1), opt_input(inputs, 2)
    if x.dtype.kind == "f":
        # An omitted bound is the type's lowest / largest finite value (ONNX, as onnxruntime
        # computes it): an infinity is clamped too.
        lo = np.finfo(x.dtype).min if lo is None else lo
        hi = np.finfo(x.dtype).max if hi is None else hi
    out = x
    if lo is not None:
        out = np.maximum(out, np.asarray(lo).astype(x.dtype) if x.dtype.kind != "f"
                         else x.dtype.type(np.asarray(lo)))
    if hi is not None:
        out = np.minimum(out, np.asarray(hi).astype(x.dtype) if x.dtype.kind != "f"
                         else x.dtype.type(np.asarray(hi)))
    return [as_array(out, x.dtype)]


@register("Cast")
def _cast(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    return [as_array(x, NUMPY_DTYPES[int(attrs["to"])])]


# ONNX's rounding and saturation into the narrow float types are the reference's to get right.
DECLINES["Cast"] = lambda attrs, outputs: int(attrs.get("to", 1)) not in NUMPY_DTYPES


@register("Dropout")
def _dropout(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    # Inference: the identity, and an all-true mask for the optional second output.
    x = inputs[0]
    assert x is not None
    return [x, np.ones(x.shape, dtype=np.bool_)]
