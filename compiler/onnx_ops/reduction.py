"""Reductions over axes: ``ReduceMean/Max/Min/Prod/Sum`` (axes an attribute, or an input from
opset 13 for ``ReduceSum`` and 18 for the others) and ``ArgMax``/``ArgMin``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tunecache.compiler.onnx_ops.registry import OPS, Array, OpImpl, as_array, int_tuple, norm_axis, opt_input


def _reduce(fn: Callable[..., Any], axes_input_from: int) -> OpImpl:
    def impl(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
        x = inputs[0]
        assert x is not None
        keepdims = bool(attrs.get("keepdims", 1))
        axes = int_tuple(opt_input(inputs, 1)) if opset >= axes_input_from else int_tuple(attrs.get("axes"))
        if not axes:
            if opset >= axes_input_from and attrs.get("noop_with_empty_axes", 0):
                return [x]
            axes = tuple(range(x.ndim))
        norm = tuple(norm_axis(a, x.ndim) for a in axes)
        return [as_array(fn(x, axis=norm, keepdims=keepdims), x.dtype)]
    return impl


def _lowest(dtype: np.dtype) -> Any:
    if dtype.kind == "b":
        return False
    return np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


def _highest(dtype: np.dtype) -> Any:
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max if dtype.kind in "iu" else np.inf


def _max(x: Array, axis: tuple[int, ...], keepdims: bool) -> Array:
    # An empty set's maximum is the type's lowest value (-inf), as ONNX defines it.
    return np.max(x, axis=axis, keepdims=keepdims, initial=_lowest(x.dtype))


def _min(x: Array, axis: tuple[int, ...], keepdims: bool) -> Array:
    return np.min(x, axis=axis, keepdims=keepdims, initial=_highest(x.dtype))


OPS["ReduceMean"] = _reduce(np.mean, 18)
OPS["ReduceMax"] = _reduce(_max, 18)
OPS["ReduceMin"] = _reduce(_min, 18)
OPS["ReduceProd"] = _reduce(np.prod, 18)
OPS["ReduceSum"] = _reduce(np.sum, 13)


def _arg(fn: Callable[..., Any]) -> OpImpl:
    def impl(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
        x = inputs[0]
        assert x is not None
        axis = norm_axis(int(attrs.get("axis", 0)), x.ndim)
        if attrs.get("select_last_index", 0):
            flipped = np.flip(x, axis)
            out = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            out = fn(x, axis=axis)
        if attrs.get("keepdims", 1):
            out = np.expand_dims(out, axis)
        return [as_array(out, np.dtype(np.int64))]
    return impl


OPS["ArgMax"] = _arg(np.argmax)
OPS["ArgMin"] = _arg(np.argmin)
