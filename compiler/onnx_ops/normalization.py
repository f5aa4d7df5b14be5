"""Normalisations and activations over axes: ``Softmax`` and ``LogSoftmax`` (the opset-13
change of axis semantics included), ``BatchNormalization``, ``LayerNormalization`` and ``LRN``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tunecache.compiler.onnx_ops.registry import (
    OPS,
    SHAPE_FIXES,
    Array,
    OpImpl,
    as_array,
    norm_axis,
    opt_input,
    register,
)


def _softmax_family(log: bool) -> OpImpl:
    def impl(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
        x = inputs[0]
        assert x is not None
        if opset < 13:
            # Before opset 13 the input is coerced to 2-D at `axis` (default 1) and the
            # softmax runs over the flattened trailing block.
            axis = norm_axis(int(attrs.get("axis", 1)), x.ndim)
            flat = x.reshape(math.prod(x.shape[:axis]), -1)
            return [as_array(_softmax(flat, 1, log).reshape(x.shape), x.dtype)]
        axis = norm_axis(int(attrs.get("axis", -1)), x.ndim)
        return [as_array(_softmax(x, axis, log), x.dtype)]
    return impl


def _softmax(x: Array, axis: int, log: bool) -> Array:
    # A row of -inf (attention fully masked) gives NaN, as ONNX specifies; exporters follow
    # it with Where(IsNaN(...)), so numpy's warning about it is noise.
    with np.errstate(invalid="ignore"):
        return _softmax_rows(x, axis, log)


def _softmax_rows(x: Array, axis: int, log: bool) -> Array:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    if log:
        total = np.sum(np.exp(shifted), axis=axis, keepdims=True)
        shifted -= np.log(total)
        return shifted
    # In place: one full-size temporary instead of three.
    np.exp(shifted, out=shifted)
    shifted /= np.sum(shifted, axis=axis, keepdims=True)
    return shifted


OPS["Softmax"] = _softmax_family(False)
OPS["LogSoftmax"] = _softmax_family(True)


@register("BatchNormalization")
def _batch_norm(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                opset: int) -> list[Array]:
    x, scale, bias, mean, var = inputs[:5]
    assert x is not None and scale is not None and bias is not None
    assert mean is not None and var is not None
    eps = float(attrs.get("epsilon", 1e-5))
    if scale.ndim == 1:
        # Per-channel parameters broadcast over axis 1 (spatial=1, and every opset >= 9
        # except opset 9's spatial=0 where they come shaped (C, D1, ...)).
        shape = (1, -1) + (1,) * (x.ndim - 2)
        scale, bias, mean, var = (p.reshape(shape) for p in (scale, bias, mean, var))
    t = x.dtype.type
    y = (x - mean) * (scale / np.sqrt(var + t(eps))) + bias
    return [as_array(y, x.dtype)]


def _inplace(ufunc: np.ufunc, a: Array, b: Array) -> Array:
    """``ufunc(a, b)``, written into ``a`` (a temporary of the caller's) when the result
    has ``a``'s shape and dtype: saves a full-size allocation per step."""
    if a.shape == np.broadcast_shapes(a.shape, b.shape) and a.dtype == np.result_type(a, b):
        return np.asarray(ufunc(a, b, out=a))
    return np.asarray(ufunc(a, b))


@register("LayerNormalization")
def _layer_norm(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                opset: int) -> list[Array]:
    x, scale = inputs[0], inputs[1]
    bias = opt_input(inputs, 2)
    assert x is not None and scale is not None
    axis = norm_axis(int(attrs.get("axis", -1)), x.ndim)
    eps = x.dtype.type(attrs.get("epsilon", 1e-5))
    axes = tuple(range(axis, x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    centred = x - mean
    var = np.mean(np.square(centred), axis=axes, keepdims=True)
    inv_std = np.reciprocal(np.sqrt(var + eps))
    y = _inplace(np.multiply, centred, inv_std)
    y = _inplace(np.multiply, y, scale)
    if bias is not None:
        y = _inplace(np.add, y, bias)
    return [as_array(y, x.dtype), as_array(mean, x.dtype), as_array(inv_std, x.dtype)]


@register("GroupNormalization")
def _group_norm(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                opset: int) -> list[Array]:
    """Per image and group of channels; scale and bias per group (opset 18) or per channel
    (21, which also computes in ``stash_type``, float32 by default)."""
    x, scale, bias = inputs[0], inputs[1], inputs[2]
    assert x is not None and scale is not None and bias is not None
    groups, eps = int(attrs["num_groups"]), float(attrs.get("epsilon", 1e-5))
    n, c = x.shape[0], x.shape[1]
    g = x.astype(np.float32 if opset >= 21 else x.dtype).reshape(n, groups, -1)
    mean = g.mean(axis=2, keepdims=True)
    var = np.square(g - mean).mean(axis=2, keepdims=True)
    y = (g - mean) / np.sqrt(var + eps)
    if opset < 21:
        y = y * scale.reshape(1, groups, 1) + bias.reshape(1, groups, 1)
        return [as_array(y.reshape(x.shape), x.dtype)]
    per_channel = (1, c) + (1,) * (x.ndim - 2)
    y = y.reshape(x.shape).astype(x.dtype)
    return [as_array(y * scale.reshape(per_channel) + bias.reshape(per_channel), x.dtype)]


def _same_shape(attrs: Mapping[str, Any], shape: tuple[int | None, ...]
                ) -> tuple[int | None, ...]:
    """GroupNormalization's output shape: its input's (onnx 1.23's shape inference gives
    opset 21's none, so everything after it would lose its shape)."""
    return shape


SHAPE_FIXES["GroupNormalization"] = _same_shape


@register("LRN")
def _lrn(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    size = int(attrs["size"])
    alpha = float(attrs.get("alpha", 1e-4))
    beta = float(attrs.get("beta", 0.75))
    bias = float(attrs.get("bias", 1.0))
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = x * x
    pad = [(0, 0)] * x.ndim
    pad[1] = (lo, hi)
    padded = np.pad(sq, pad)
    window = sliding_window_view(padded, size, axis=1).sum(axis=-1)
    t = x.dtype.type
    return [as_array(x / (t(bias) + t(alpha / size) * window) ** t(beta), x.dtype)]
