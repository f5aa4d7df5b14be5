"""``Resize`` in numpy: every resized axis is one interpolation matrix.

Resize is separable: along each axis, each output position is a weighted sum of a few
input positions (two for linear, four for cubic, more when antialiasing a downscale, one
for nearest). :func:`axis_weights` builds that axis's ``[out, in]`` matrix once per shape
and attributes (cached), with ONNX's coordinate modes (``half_pixel``,
``half_pixel_symmetric``, ``pytorch_half_pixel``, ``align_corners``, ``asymmetric``,
``tf_crop_and_resize`` with its extrapolation), nearest modes, the cubic coefficient,
``exclude_outside`` and ``antialias``; applying it is a matrix product on the last two axes
(a segmentation head's bilinear upsampling: two small GEMMs) or a gather for nearest. The
weights are the reference implementation's, position for position; onnx.reference
computes them per output element in Python (LRASPP's upsampling took 46 ms a run there).
Opset 10's Resize (``X, scales``; no coordinate modes) is read as onnxruntime reads it:
asymmetric coordinates, nearest rounding down when upsampling and up when downsampling
(onnx.reference takes its scales for a region of interest and fails).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from tunecache.compiler.onnx_ops.registry import Array, opt_input, register


@dataclass(frozen=True)
class AxisResize:
    """How one axis is resized: the node's attributes plus this axis's sizes and scale."""

    mode: str
    coordinates: str
    nearest: str
    cubic_a: float
    exclude_outside: bool
    antialias: bool
    length: int
    out: int
    scale: float
    roi: tuple[float, float] | None


@register("Resize", in_subgraphs=True)
def _resize(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    legacy = opset < 11  # (X, scales); asymmetric coordinates, onnxruntime's "simple" nearest
    roi, scales, sizes = (None, _given(inputs[1]), None) if legacy else (
        _given(opt_input(inputs, k)) for k in (1, 2, 3))
    axes = [a + x.ndim if a < 0 else a for a in attrs.get("axes", range(x.ndim))]
    factors, outs = _targets(x.shape, axes, scales, sizes,
                             str(attrs.get("keep_aspect_ratio_policy", "stretch")))
    y = x if x.dtype in (np.float32, np.float64) else x.astype(np.float64)
    for k, axis in enumerate(axes):
        span = None if roi is None else (float(roi[k]), float(roi[k + len(axes)]))
        if math.isclose(factors[k], 1.0) and outs[k] == x.shape[axis] and (
                span is None or (math.isclose(span[0], 0.0) and math.isclose(span[1], 1.0))):
            continue
        step = AxisResize(
            str(attrs.get("mode", "nearest")), "asymmetric" if legacy else str(attrs.get(
                "coordinate_transformation_mode", "half_pixel")),
            ("ceil" if factors[k] < 1 else "floor") if legacy else str(attrs.get(
                "nearest_mode", "round_prefer_floor")),
            float(attrs.get("cubic_coeff_a", -0.75)), bool(attrs.get("exclude_outside", 0)),
            bool(attrs.get("antialias", 0)), x.shape[axis], outs[k], factors[k], span)
        y = _along(y, axis, step, float(attrs.get("extrapolation_value", 0.0)))
    if y.dtype != x.dtype:
        import onnx

        y = onnx.numpy_helper.saturate_cast(y, x.dtype)
    return [np.ascontiguousarray(y)]


def _given(value: Array | None) -> Array | None:
    return None if value is None or value.size == 0 else value.reshape(-1)


def _targets(shape: tuple[int, ...], axes: list[int], scales: Array | None,
             sizes: Array | None, policy: str) -> tuple[list[float], list[int]]:
    """Each resized axis's scale and output length, from ``scales`` or from ``sizes``
    (and the aspect-ratio policy)."""
    if sizes is None:
        assert scales is not None
        factors = [float(s) for s in scales]
        return factors, [int(f * shape[a]) for f, a in zip(factors, axes, strict=True)]
    factors = [int(s) / shape[a] for s, a in zip(sizes, axes, strict=True)]
    if policy == "stretch":
        return factors, [int(s) for s in sizes]
    scale = min(factors) if policy == "not_larger" else max(factors)
    return [scale] * len(axes), [int(scale * shape[a] + 0.5) for a in axes]


def _along(x: Array, axis: int, step: AxisResize, extrapolation: float) -> Array:
    """``x`` resized along ``axis``."""
    weights, outside, picks = axis_weights(step)
    if picks is not None:
        y = np.take(x, picks, axis=axis)
    else:
        w = weights.astype(x.dtype, copy=False)
        if axis == x.ndim - 1:
            y = x @ w.T
        elif axis == x.ndim - 2:
            y = w @ x
        else:
            y = np.moveaxis(np.tensordot(w, x, axes=(1, axis)), 0, axis)
    if outside.any():
        mask = outside.reshape((-1,) + (1,) * (x.ndim - axis - 1))
        y = np.where(mask, x.dtype.type(extrapolation), y)
    return y


@cache
def axis_weights(step: AxisResize) -> tuple[Array, Array, Array | None]:
    """``(weights [out, in], extrapolated [out], picks)``: the interpolation matrix of one
    axis, which output positions take the extrapolation value instead, and, where every
    row picks one input position (nearest), those positions."""
    origin, outside = _source_positions(step)
    base = np.where(origin == np.floor(origin), origin - 1, np.floor(origin))
    ratio = origin - base  # in (0, 1]: an integer position is 1 past the one below it
    coeffs = _coefficients(step, ratio)
    taps = coeffs.shape[1]
    neighbours = base.astype(np.int64)[:, None] - taps // 2 + 1 + np.arange(taps)
    if step.exclude_outside:
        coeffs = np.where((neighbours < 0) | (neighbours >= step.length), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    weights = np.zeros((step.out, step.length))
    rows = np.broadcast_to(np.arange(step.out)[:, None], neighbours.shape)
    np.add.at(weights, (rows, np.clip(neighbours, 0, step.length - 1)), coeffs)
    weights.flags.writeable = False
    one_hot = ((weights == 1.0).sum(axis=1) == 1) & ((weights != 0).sum(axis=1) == 1)
    picks = np.argmax(weights, axis=1) if one_hot.all() else None
    return weights, outside, picks


def _source_positions(step: AxisResize) -> tuple[Array, Array]:
    """Each output position's coordinate in the input, and whether it lies outside the
    crop (``tf_crop_and_resize`` only)."""
    y = np.arange(step.out, dtype=np.float64)
    scale, length = step.scale, step.length
    width = scale * length  # the output length as the scale gives it (not rounded)
    none = np.zeros(step.out, np.bool_)
    if step.coordinates == "align_corners":
        return (np.zeros(step.out) if width == 1 else y * (length - 1) / (width - 1)), none
    if step.coordinates == "asymmetric":
        return y / scale, none
    if step.coordinates == "pytorch_half_pixel":
        return (np.full(step.out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5), none
    if step.coordinates == "half_pixel_symmetric":
        offset = length / 2 * (1 - step.out / width)
        return offset + (y + 0.5) / scale - 0.5, none
    if step.coordinates == "tf_crop_and_resize":
        start, end = step.roi or (0.0, 1.0)
        x = (np.full(step.out, (end - start) * (length - 1) / 2) if width == 1
             else y * (end - start) * (length - 1) / (width - 1)) + start * (length - 1)
        return x, (x < 0) | (x > length - 1)
    if step.coordinates == "half_pixel":
        return (y + 0.5) / scale - 0.5, none
    raise ValueError(f"unknown coordinate_transformation_mode {step.coordinates!r}")


def _coefficients(step: AxisResize, ratio: Array) -> Array:
    """``[out, taps]``: each output's weights on its neighbours, the first at
    ``base - taps/2 + 1`` (``ratio`` is the position's distance past ``base``)."""
    r = ratio[:, None]
    if step.mode == "nearest":
        whole = (ratio == 1.0)[:, None]
        up = {"round_prefer_floor": r > 0.5, "round_prefer_ceil": r >= 0.5,
              "floor": np.zeros_like(r, np.bool_), "ceil": np.ones_like(r, np.bool_)}[
            step.nearest]
        up = whole | up
        return np.concatenate([~up, up], axis=1).astype(np.float64)
    if step.antialias and step.scale < 1.0:
        return _antialiased(step, r)
    if step.mode == "linear":
        return np.concatenate([1 - r, r], axis=1)
    distance = np.concatenate([r + 1, r, 1 - r, 2 - r], axis=1)  # to each of the 4 taps
    return _cubic(distance, step.cubic_a)


def _antialiased(step: AxisResize, r: Array) -> Array:
    """Downscaling with ``antialias``: the filter stretched by ``1 / scale``, normalized."""
    scale = step.scale
    reach = 1 if step.mode == "linear" else 2
    first = math.floor(-reach / scale) + 1
    distance = np.abs((np.arange(first, 2 - first) - r) * scale)
    coeffs = np.clip(1 - distance, 0, 1) if step.mode == "linear" else _cubic(
        distance, step.cubic_a)
    return coeffs / coeffs.sum(axis=1, keepdims=True)


def _cubic(d: Array, a: float) -> Array:
    """Keys' cubic convolution kernel with coefficient ``a`` at distances ``d >= 0``."""
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))
