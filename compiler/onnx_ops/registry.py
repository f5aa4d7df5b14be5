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

# ONNX TensorProto element types -> numpy dtypes: numpy's own, which tunecache's numpy
# implementations compute with,
NUMPY_DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.float32), 2: np.dtype(np.uint8), 3: np.dtype(np.int8),
    4: np.dtype(np.uint16), 5: np.dtype(np.int16), 6: np.dtype(np.int32),
    7: np.dtype(np.int64), 9: np.dtype(np.bool_), 10: np.dtype(np.float16),
    11: np.dtype(np.float64), 12: np.dtype(np.uint32), 13: np.dtype(np.uint64),
}


_ML_DTYPES = {16: "bfloat16", 17: "float8_e4m3fn", 18: "float8_e4m3fnuz", 19: "float8_e5m2",
              20: "float8_e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4_e2m1fn",
              24: "float8_e8m0fnu", 25: "uint2", 26: "int2"}


def _all_dtypes() -> dict[int, np.dtype]:
    """NUMPY_DTYPES and the rest ONNX maps to numpy: strings (object), complex, and the
    ``ml_dtypes`` types (bfloat16, the float8s, int4 / uint4, …) onnx itself depends on."""
    out = {**NUMPY_DTYPES, 8: np.dtype(object), 14: np.dtype(np.complex64),
           15: np.dtype(np.complex128)}
    try:
        import ml_dtypes
    except ImportError:
        return out
    for code, name in _ML_DTYPES.items():
        if hasattr(ml_dtypes, name):
            out[code] = np.dtype(getattr(ml_dtypes, name))
    return dict(sorted(out.items()))


# … and every other: the reference implementation (:mod:`.reference`) computes with them.
ONNX_DTYPES: dict[int, np.dtype] = _all_dtypes()


SUBGRAPH_OPS: set[str] = set()
"""Op types whose numpy implementation also runs inside the subgraphs of an If, Loop or
Scan that ONNX's reference implementation evaluates (where its own would be far slower:
a NonMaxSuppression in the branch of an If)."""


def register(*names: str, in_subgraphs: bool = False) -> Callable[[OpImpl], OpImpl]:
    """A decorator entering its function in :data:`OPS` under each of ``names`` (and in
    :data:`SUBGRAPH_OPS` with ``in_subgraphs``)."""

    def wrap(fn: OpImpl) -> OpImpl:
        for name in names:
            OPS[name] = fn
            if in_subgraphs:
                SUBGRAPH_OPS.add(name)
        return fn
    return wrap


ShapeFix = Callable[[Mapping[str, Any], tuple[int | None, ...]],
                    "tuple[int | None, ...] | None"]
SHAPE_FIXES: dict[str, ShapeFix] = {}
"""Ops whose output shape ONNX shape inference can get wrong or leave out, by op type:
``fix(attrs, input shape)`` (None for a dim not known) is the shape the implementation (and
onnxruntime) gives, or None where inference is right; the output's dtype is the input's."""


def shape_fix(op_type: str) -> ShapeFix | None:
    """What corrects shape inference for ``op_type`` (default domain), or None."""
    return SHAPE_FIXES.get(op_type)


def implementation(op_type: str) -> OpImpl | None:
    """The numpy implementation of ``op_type`` (default domain), or None."""
    return OPS.get(op_type)


ENGINES = ("numpy", "reference")
"""What runs a node outside generated kernels: tunecache's numpy code (:data:`OPS`), or
ONNX's reference implementation (:mod:`.reference`) for the standard ops with none here."""


DECLINES: dict[str, Callable[[Mapping[str, Any], Sequence[str]], bool]] = {}
"""Per op type, when its numpy implementation leaves a node to the reference one:
``declines(attrs, outputs)`` (a Cast to bfloat16 or a float8, a MaxPool asked for its
indices, …)."""


def engine(op_type: str, opset: int, attrs: Mapping[str, Any] | None = None,
           outputs: Sequence[str] = ()) -> str | None:
    """What runs a default-domain ``op_type`` node at ``opset`` (one of :data:`ENGINES`),
    or None where nothing can; ``attrs`` and ``outputs`` are the node's."""
    from tunecache.compiler.onnx_ops.reference import has_reference

    declines = DECLINES.get(op_type)
    if op_type in OPS and not (declines and declines(attrs or {}, outputs)):
        return "numpy"
    return "reference" if has_reference(op_type, opset) else None


def node_function(op_type: str, inputs: Sequence[str], outputs: Sequence[str],
                  attrs: Mapping[str, Any], opset: int
                  ) -> Callable[[Sequence[Array | None]], list[Array]]:
    """The function running one node: called with its input arrays in the node's order
    (None for an omitted optional one), it returns its outputs in the node's order."""
    if engine(op_type, opset, attrs, outputs) == "numpy":
        impl = OPS[op_type]
        return lambda values: impl(values, attrs, opset)
    from tunecache.compiler.onnx_ops.reference import reference_function

    return reference_function(op_type, inputs, outputs, attrs, opset)


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
