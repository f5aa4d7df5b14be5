"""The registry of the numpy ONNX ops and what their implementations share.

:data:`OPS` maps op type to implementation (the family modules add theirs with
:func:`register` when imported); :func:`implementation` looks one up. :data:`ONNX_DTYPES`
maps ONNX element types to numpy dtypes. The helpers read a node's inputs and attributes
the ONNX way: :func:`as_array` keeps results ndarrays of a dtype, :func:`int_tuple` turns an
int tensor or list into a tuple, :func:`norm_axis` resolves a negative axis,
:func:`opt_input` reads an optional input that may be absent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

Array = np.ndarray
OpImpl = Callable[[Sequence["Array | None"], Mapping[str, Any], int], list[Array]]

OPS: dict[str, OpImpl] = {}

# ONNX TensorProto element types -> numpy dtypes (the ones an inference graph meets).
ONNX_DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.float32), 2: np.dtype(np.uint8), 3: np.dtype(np.int8),
    4: np.dtype(np.uint16), 5: np.dtype(np.int16), 6: np.dtype(np.int32),
    7: np.dtype(np.int64), 9: np.dtype(np.bool_), 10: np.dtype(np.float16),
    11: np.dtype(np.float64), 12: np.dtype(np.uint32), 13: np.dtype(np.uint64),
}


def register(*names: str) -> Callable[[OpImpl], OpImpl]:
    """A decorator entering its function in :data:`OPS` under each of ``names``."""

    def wrap(fn: OpImpl) -> OpImpl:
        for name in names:
            OPS[name] = fn
        return fn
    return wrap


ShapeFix = Callable[[Mapping[str, Any], tuple[int, ...]], "tuple[int, ...] | None"]
SHAPE_FIXES: dict[str, ShapeFix] = {}
"""Ops whose output shape ONNX shape inference can get wrong, by op type: ``fix(attrs,
input shape)`` is the shape the implementation (and onnxruntime) gives, or None where
inference is right."""


def shape_fix(op_type: str) -> ShapeFix | None:
    """What corrects shape inference for ``op_type`` (default domain), or None."""
    return SHAPE_FIXES.get(op_type)


def implementation(op_type: str) -> OpImpl | None:
    """The numpy implementation of ``op_type`` (default domain), or None."""
    return OPS.get(op_type)


def as_array(x: Any, dtype: np.dtype | None = None) -> Array:
    # numpy ufuncs on 0-d arrays return scalars; keep everything an ndarray.
    out = np.asarray(x)
    if dtype is not None and out.dtype != dtype:
        out = out.astype(dtype)
    return out


def int_tuple(x: Array | Sequence[int] | None) -> tuple[int, ...] | None:
    """An int tensor or sequence as a flat tuple of ints; None stays None."""
    if x is None:
        return None
    return tuple(int(v) for v in np.asarray(x).reshape(-1))


def norm_axis(axis: int, rank: int) -> int:
    """``axis`` of a tensor of ``rank`` dims, a negative one counted from the end."""
    return axis + rank if axis < 0 else axis


def opt_input(inputs: Sequence[Array | None], i: int) -> Array | None:
    """Input ``i``, or None where the node gives fewer inputs."""
    return inputs[i] if len(inputs) > i else None
