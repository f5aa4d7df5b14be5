"""Ops that make tensors from attributes and scalars: ``Constant`` (:func:`constant_value`),
``ConstantOfShape`` and ``Range``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tunecache.compiler.onnx_ops.registry import Array, int_tuple, register


@register("Constant")
def _constant(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    return [constant_value(attrs)]


def constant_value(attrs: Mapping[str, Any]) -> Array:
    """The value of a ``Constant`` node from whichever attribute holds it."""
    if "value" in attrs:
        return np.asarray(attrs["value"])
    if "value_float" in attrs:
        return np.asarray(attrs["value_float"], dtype=np.float32)
    if "value_floats" in attrs:
        return np.asarray(attrs["value_floats"], dtype=np.float32)
    if "value_int" in attrs:
        return np.asarray(attrs["value_int"], dtype=np.int64)
    if "value_ints" in attrs:
        return np.asarray(attrs["value_ints"], dtype=np.int64)
    raise ValueError(f"Constant with unsupported attribute(s) {', '.join(attrs) or 'none'}")


@register("ConstantOfShape")
def _constant_of_shape(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                       opset: int) -> list[Array]:
    shape = int_tuple(inputs[0]) or ()
    value = attrs.get("value")
    fill = np.asarray(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    return [np.full(shape, fill[0], dtype=fill.dtype)]


@register("Range")
def _range(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    start, limit, delta = inputs
    assert start is not None and limit is not None and delta is not None
    return [np.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype)]
