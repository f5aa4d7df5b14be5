"""Pooling: ``MaxPool`` and ``AveragePool`` over any number of spatial axes (``auto_pad``,
dilations, ``ceil_mode``, ``count_include_pad``), ``GlobalAveragePool`` and ``GlobalMaxPool``;
:func:`resolve_pads` turns ``auto_pad`` into explicit pads (``Conv`` and the pool lowering use
it too); :func:`pool_output_sizes` gives a window pool's output sizes.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tunecache.compiler.onnx_ops.registry import (
    DECLINES,
    SHAPE_FIXES,
    Array,
    as_array,
    register,
)


def resolve_pads(auto_pad: str, in_sizes: Sequence[int], kernel: Sequence[int],
                 strides: Sequence[int], dilations: Sequence[int],
                 pads: Sequence[int] | None) -> tuple[int, ...]:
    """Explicit ONNX ``pads`` (all begins, then all ends) for an ``auto_pad`` setting."""
    n = len(in_sizes)
    if auto_pad in ("", "NOTSET"):
        return tuple(pads) if pads else (0,) * (2 * n)
    if auto_pad == "VALID":
        return (0,) * (2 * n)
    begins, ends = [], []
    for size, k, s, d in zip(in_sizes, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max(0, (out - 1) * s + d * (k - 1) + 1 - size)
        small, large = total // 2, total - total // 2
        # SAME_UPPER puts the extra padding at the end, SAME_LOWER at the beginning.
        begin, end = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        begins.append(begin)
        ends.append(end)
    return tuple(begins + ends)


def _ceil_mode_shape(attrs: Mapping[str, Any], shape: tuple[int | None, ...]
                     ) -> tuple[int, ...] | None:
    """A ceil-mode pool's output shape (ONNX shape inference keeps a last window that starts
    past the input and its begin padding, which onnxruntime and this implementation drop)."""
    if not attrs.get("ceil_mode") or "kernel_shape" not in attrs or len(shape) < 3 or \
            None in shape:
        return None
    x = tuple(int(d or 0) for d in shape)
    sizes = pool_output_sizes(x[2:], attrs)
    return (*x[:2], *sizes) if min(sizes) > 0 else None


SHAPE_FIXES["MaxPool"] = SHAPE_FIXES["AveragePool"] = _ceil_mode_shape
# The indices output is the reference implementation's.
DECLINES["MaxPool"] = lambda attrs, outputs: any(outputs[1:])


def pool_output_sizes(in_sizes: Sequence[int], attrs: Mapping[str, Any]) -> tuple[int, ...]:
    """The spatial output sizes of a ``MaxPool``/``AveragePool`` node with ``attrs`` over
    an input of spatial sizes ``in_sizes``, as onnxruntime computes them: with
    ``ceil_mode``, a last window that would start past the input and its begin padding is
    dropped (ONNX shape inference keeps it)."""
    nsp = len(in_sizes)
    kernel = tuple(int(k) for k in attrs["kernel_shape"])
    strides = tuple(attrs.get("strides", (1,) * nsp))
    dilations = tuple(attrs.get("dilations", (1,) * nsp))
    pads = resolve_pads(str(attrs.get("auto_pad", "NOTSET")), in_sizes, kernel, strides,
                        dilations, attrs.get("pads"))
    ceil_mode = bool(attrs.get("ceil_mode", 0))
    sizes = []
    for i in range(nsp):
        extent = dilations[i] * (kernel[i] - 1) + 1
        span = in_sizes[i] + pads[i] + pads[nsp + i] - extent
        out = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (out - 1) * strides[i] >= in_sizes[i] + pads[i]:
            out -= 1  # the last window must start inside the input or its begin padding
        sizes.append(out)
    return tuple(sizes)


def _pool(inputs: Sequence[Array | None], attrs: Mapping[str, Any], mode: str) -> Array:
    x = inputs[0]
    assert x is not None
    nsp = x.ndim - 2
    kernel = tuple(int(k) for k in attrs["kernel_shape"])
    strides = tuple(attrs.get("strides", (1,) * nsp))
    dilations = tuple(attrs.get("dilations", (1,) * nsp))
    pads = resolve_pads(str(attrs.get("auto_pad", "NOTSET")), x.shape[2:], kernel, strides,
                        dilations, attrs.get("pads"))
    extra = []
    for i, out in enumerate(pool_output_sizes(x.shape[2:], attrs)):
        extent = dilations[i] * (kernel[i] - 1) + 1
        span = x.shape[2 + i] + pads[i] + pads[nsp + i] - extent
        extra.append(max(0, (out - 1) * strides[i] + extent - (span + extent)))
    widths = [(0, 0), (0, 0)] + [(pads[i], pads[nsp + i] + extra[i]) for i in range(nsp)]
    fill = -np.inf if mode == "max" else 0.0
    xp = np.pad(x, widths, constant_values=fill)
    spatial = tuple(range(2, x.ndim))
    extents = tuple(dilations[i] * (kernel[i] - 1) + 1 for i in range(nsp))

    def windows(a: Array) -> Array:
        w = sliding_window_view(a, extents, axis=spatial)
        index = (slice(None), slice(None), *(slice(None, None, s) for s in strides),
                 *(slice(None, None, d) for d in dilations))
        return w[index]

    win = windows(xp)
    # Reduce with one elementwise op per kernel offset over strided views: numpy's reduction
    # over the tiny, non-contiguous window axes is ~10x slower (measured: ResNet-50's
    # 3x3/2 max pool at 112x112x64 took most of the non-kernel time).
    out_shape = win.shape[2:2 + nsp]
    total: Array | None = None
    for offset in itertools.product(*(range(k) for k in kernel)):
        view = xp[(slice(None), slice(None), *(
            slice(o * d, o * d + (n - 1) * st + 1, st)
            for o, d, n, st in zip(offset, dilations, out_shape, strides, strict=True)))]
        if total is None:
            total = view.copy()
        elif mode == "max":
            np.maximum(total, view, out=total)
        else:
            np.add(total, view, out=total)
    assert total is not None
    if mode == "max":
        return as_array(total, x.dtype)
    window_axes = tuple(range(x.ndim, x.ndim + nsp))
    # Divide by the window's element count: real elements only (count_include_pad=0) or
    # including the explicit pads, never the extra ceil_mode padding.
    include = bool(attrs.get("count_include_pad", 0))
    mask_shape = (1, 1, *x.shape[2:])
    mask = np.ones(mask_shape, dtype=x.dtype)
    if include:
        mask = np.pad(mask, [(0, 0), (0, 0)] + [(pads[i], pads[nsp + i]) for i in range(nsp)],
                      constant_values=1.0)
        mask = np.pad(mask, [(0, 0), (0, 0)] + [(0, extra[i]) for i in range(nsp)])
    else:
        mask = np.pad(mask, widths)
    counts = np.sum(windows(mask), axis=window_axes)
    return as_array(total / counts, x.dtype)


@register("MaxPool")
def _max_pool(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    return [_pool(inputs, attrs, "max")]


@register("AveragePool")
def _avg_pool(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    return [_pool(inputs, attrs, "avg")]


@register("GlobalAveragePool")
def _global_avg(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    return [as_array(np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True), x.dtype)]


@register("GlobalMaxPool")
def _global_max(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    return [as_array(np.max(x, axis=tuple(range(2, x.ndim)), keepdims=True), x.dtype)]
