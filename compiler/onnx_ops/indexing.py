"""Ops that pick, mask or accumulate elements by their indices: ``Gather``,
``GatherElements``, ``GatherND``, ``ScatterElements`` (and opset 9's ``Scatter``),
``ScatterND`` (negative indices wrap; scatters with every ``reduction``, a repeated index
without one keeping the last update, as ONNX's reference does), ``Trilu`` and ``CumSum``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tunecache.compiler.onnx_ops.registry import Array, norm_axis, opt_input, register


@register("Gather")
def _gather(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x, idx = inputs[0], inputs[1]
    assert x is not None and idx is not None
    axis = norm_axis(int(attrs.get("axis", 0)), x.ndim)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return [np.take(x, idx, axis=axis)]


@register("GatherElements")
def _gather_elements(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                     opset: int) -> list[Array]:
    x, idx = inputs[0], inputs[1]
    assert x is not None and idx is not None
    axis = norm_axis(int(attrs.get("axis", 0)), x.ndim)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return [np.take_along_axis(x, idx, axis=axis)]


@register("GatherND")
def _gather_nd(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x, idx = inputs[0], inputs[1]
    assert x is not None and idx is not None
    b = int(attrs.get("batch_dims", 0))
    depth = idx.shape[-1]
    idx = np.where(idx < 0, idx + np.asarray(x.shape[b:b + depth]), idx)
    batch = x.shape[:b]
    # Flatten the batch dimensions into one, index each batch's slice with the tuple of
    # index columns, then restore the batch dimensions in front.
    xs = x.reshape((math.prod(batch), *x.shape[b:]))
    ids = idx.reshape((math.prod(batch), -1, depth))
    rows = np.arange(xs.shape[0]).reshape(-1, 1)
    picked = xs[(rows, *(ids[..., k] for k in range(depth)))]
    return [picked.reshape((*idx.shape[:-1], *x.shape[b + depth:]))]


_REDUCTIONS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scattered(data: Array, where: tuple[Array, ...], updates: Array, reduction: str) -> Array:
    """A copy of ``data`` with ``updates`` written (or reduced) at the index arrays
    ``where``."""
    out = data.copy()
    if reduction == "none":
        out[where] = updates
    else:
        _REDUCTIONS[reduction].at(out, where, updates)
    return out


@register("ScatterElements", "Scatter", in_subgraphs=True)
def _scatter_elements(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                      opset: int) -> list[Array]:
    data, idx, updates = inputs[0], inputs[1], inputs[2]
    assert data is not None and idx is not None and updates is not None
    axis = norm_axis(int(attrs.get("axis", 0)), data.ndim)
    where: list[Array] = list(np.indices(idx.shape, sparse=True))
    where[axis] = np.where(idx < 0, idx + data.shape[axis], idx)
    return [_scattered(data, tuple(where), updates, str(attrs.get("reduction", "none")))]


@register("ScatterND", in_subgraphs=True)
def _scatter_nd(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                opset: int) -> list[Array]:
    data, idx, updates = inputs[0], inputs[1], inputs[2]
    assert data is not None and idx is not None and updates is not None
    depth = idx.shape[-1]
    rows = idx.reshape(-1, depth)
    rows = np.where(rows < 0, rows + np.asarray(data.shape[:depth]), rows)
    where = tuple(rows[:, k] for k in range(depth))
    block = updates.reshape((rows.shape[0], *data.shape[depth:]))
    return [_scattered(data, where, block, str(attrs.get("reduction", "none")))]


@register("Trilu")
def _trilu(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    k_in = opt_input(inputs, 1)
    k = int(k_in.reshape(-1)[0]) if k_in is not None else 0
    return [np.triu(x, k) if attrs.get("upper", 1) else np.tril(x, k)]


@register("CumSum")
def _cumsum(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x, axis_in = inputs[0], inputs[1]
    assert x is not None and axis_in is not None
    axis = norm_axis(int(axis_in.reshape(-1)[0]), x.ndim)
    y = np.flip(x, axis) if attrs.get("reverse", 0) else x
    out = np.cumsum(y, axis=axis, dtype=x.dtype)
    if attrs.get("exclusive", 0):
        out = np.concatenate([np.zeros_like(np.take(out, [0], axis=axis)),
                              np.take(out, range(out.shape[axis] - 1), axis=axis)], axis=axis)
    return [np.flip(out, axis) if attrs.get("reverse", 0) else out]
