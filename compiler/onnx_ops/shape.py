"""Shape manipulation: ops that rearrange a tensor's elements (``Reshape``, ``Flatten``,
``Transpose``, ``Squeeze``, ``Unsqueeze``, ``Concat``, ``Split``, ``Slice``, ``Expand``,
``Tile``, ``Pad``) or read its shape (``Shape``, ``Size``); :func:`reshape_target` and
:func:`shape_of` give the frontend their output shapes without running them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tunecache.compiler.onnx_ops.registry import Array, int_tuple, norm_axis, opt_input, register


@register("Reshape")
def _reshape(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x, shape_in = inputs[0], inputs[1]
    assert x is not None and shape_in is not None
    return [x.reshape(reshape_target(x.shape, int_tuple(shape_in) or (),
                                     bool(attrs.get("allowzero", 0))))]


def reshape_target(in_shape: Sequence[int], shape: Sequence[int], allowzero: bool) -> tuple[int, ...]:
    """ONNX Reshape's output shape: ``0`` copies the input dim (unless allowzero), ``-1`` infers."""
    out = [in_shape[i] if (v == 0 and not allowzero) else v for i, v in enumerate(shape)]
    if -1 in out:
        known = math.prod(v for v in out if v != -1)
        out[out.index(-1)] = math.prod(in_shape) // known if known else 0
    return tuple(out)


@register("Flatten")
def _flatten(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    axis = norm_axis(int(attrs.get("axis", 1)), x.ndim)
    return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


@register("Transpose")
def _transpose(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
               opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    perm = attrs.get("perm")
    return [np.transpose(x, tuple(perm) if perm is not None else None)]


@register("Squeeze")
def _squeeze(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    axes = int_tuple(opt_input(inputs, 1)) if opset >= 13 else int_tuple(attrs.get("axes"))
    if axes is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    return [np.squeeze(x, axis=tuple(norm_axis(a, x.ndim) for a in axes))]


@register("Unsqueeze")
def _unsqueeze(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
               opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    axes = int_tuple(opt_input(inputs, 1)) if opset >= 13 else int_tuple(attrs.get("axes"))
    rank = x.ndim + len(axes or ())
    out = x
    for a in sorted(norm_axis(a, rank) for a in axes or ()):
        out = np.expand_dims(out, a)
    return [out]


@register("Concat")
def _concat(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    arrays = [x for x in inputs if x is not None]
    return [np.concatenate(arrays, axis=int(attrs["axis"]))]


@register("Split")
def _split(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    axis = norm_axis(int(attrs.get("axis", 0)), x.ndim)
    split = int_tuple(opt_input(inputs, 1)) if opset >= 13 else int_tuple(attrs.get("split"))
    if not split:
        parts = int(attrs.get("num_outputs", 1))
        size = -(-x.shape[axis] // parts)
        split = tuple(min(size, x.shape[axis] - i * size) for i in range(parts))
    bounds = np.cumsum(split)[:-1]
    return list(np.split(x, bounds, axis=axis))


@register("Slice")
def _slice(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    if opset < 10:
        starts, ends = int_tuple(attrs["starts"]), int_tuple(attrs["ends"])
        axes, steps = int_tuple(attrs.get("axes")), None
    else:
        starts, ends = int_tuple(inputs[1]), int_tuple(inputs[2])
        axes, steps = int_tuple(opt_input(inputs, 3)), int_tuple(opt_input(inputs, 4))
    assert starts is not None and ends is not None
    axes = axes or tuple(range(len(starts)))
    steps = steps or (1,) * len(starts)
    index: list[slice] = [slice(None)] * x.ndim
    for a, b, e, s in zip(axes, starts, ends, steps, strict=True):
        # Python slicing clamps out-of-range bounds the way ONNX specifies (INT64 extremes
        # included, for negative steps too).
        index[norm_axis(a, x.ndim)] = slice(b, e, s)
    return [x[tuple(index)]]


@register("Shape")
def _shape(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    return [shape_of(x.shape, attrs)]


def shape_of(shape: Sequence[int], attrs: Mapping[str, Any]) -> Array:
    """ONNX Shape's output (``start``/``end`` from opset 15) for a known input shape."""
    rank = len(shape)
    start = int(attrs.get("start", 0))
    end = attrs.get("end")
    s = max(0, min(rank, norm_axis(start, rank)))
    e = rank if end is None else max(0, min(rank, norm_axis(int(end), rank)))
    return np.asarray(shape[s:e], dtype=np.int64).reshape(-1)


@register("Size")
def _size(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    return [np.asarray(x.size, dtype=np.int64)]


@register("Expand")
def _expand(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x, shape = inputs[0], inputs[1]
    assert x is not None and shape is not None
    target = np.broadcast_shapes(x.shape, int_tuple(shape) or ())
    return [np.array(np.broadcast_to(x, target))]


@register("Tile")
def _tile(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x, reps = inputs[0], inputs[1]
    assert x is not None and reps is not None
    return [np.tile(x, int_tuple(reps) or ())]


@register("Pad")
def _pad(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    mode = str(attrs.get("mode", "constant"))
    if opset < 11:
        pads = int_tuple(attrs["pads"])
        value: Any = attrs.get("value", 0.0)
        axes = None
    else:
        pads = int_tuple(inputs[1])
        cv = opt_input(inputs, 2)
        value = cv.reshape(-1)[0] if cv is not None and cv.size else 0
        axes = int_tuple(opt_input(inputs, 3))
    assert pads is not None
    axes = tuple(norm_axis(a, x.ndim) for a in axes) if axes else tuple(range(x.ndim))
    n = len(axes)
    widths = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        widths[a] = (pads[i], pads[n + i])
    # Negative pads crop; do that first, then pad with the non-negative part.
    crop = tuple(slice(max(0, -b), x.shape[i] - max(0, -e)) for i, (b, e) in enumerate(widths))
    x = x[crop]
    positive = [(max(0, b), max(0, e)) for b, e in widths]
    np_mode = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]
    if np_mode == "constant":
        return [np.pad(x, positive, mode="constant", constant_values=x.dtype.type(value))]
    return [np.pad(x, positive, mode=np_mode)]  # type: ignore[call-overload]
