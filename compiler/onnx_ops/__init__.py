"""numpy implementations of the ONNX operators the executor runs outside generated kernels.

Each implementation is ``impl(inputs, attrs, opset) -> outputs``: ``inputs`` in the node's
order (``None`` for an omitted optional input), ``attrs`` the node's attributes as plain
Python values (ints, floats, strings, tuples, numpy arrays for tensors), ``opset`` the model's
default-domain opset, which decides between attribute and input forms (``Slice`` before and
after opset 10, ``Squeeze``/``Unsqueeze``/``ReduceSum`` axes from 13, ``ReduceMean`` axes from
18, ``Clip``/``Pad`` bounds from 11, …). Results are float32 where the inputs are float32,
with ONNX's semantics (broadcasting, negative axes, clamped slice bounds).

:data:`OPS` maps op type to implementation; :func:`implementation` looks one up. The
implementations live in one module per family: ``elementwise``, ``normalization``,
``reduction``, ``pooling``, ``shape``, ``indexing``, ``constants``, ``kernel_ops``,
``detection`` (NonMaxSuppression, RoiAlign), ``resize`` and ``quantize`` (QuantizeLinear, QLinearConv,
MatMulInteger, …), each registering its ops in :data:`OPS` (``registry.py``) when
imported; this package imports them all. The ``MatMul``, ``Gemm`` and ``Conv``
implementations (``kernel_ops``) are the fallback for nodes the frontend does not turn
into kernels (and the numpy path of kernel ops lives in
:mod:`tunecache.compiler.executor`).
"""

from __future__ import annotations

# Imported for their registrations in OPS.
from tunecache.compiler.onnx_ops import (  # noqa: F401
    detection,
    elementwise,
    indexing,
    normalization,
    quantize,
    reduction,
    resize,
)
from tunecache.compiler.onnx_ops.constants import constant_value
from tunecache.compiler.onnx_ops.kernel_ops import ConvParams, conv_params
from tunecache.compiler.onnx_ops.pooling import pool_output_sizes, resolve_pads
from tunecache.compiler.onnx_ops.reference import SCOPE
from tunecache.compiler.onnx_ops.registry import (
    ENGINES,
    ONNX_DTYPES,
    OPS,
    Array,
    OpImpl,
    engine,
    implementation,
    node_function,
    shape_fix,
)
from tunecache.compiler.onnx_ops.shape import reshape_target, shape_of

__all__ = ["ENGINES", "ONNX_DTYPES", "OPS", "SCOPE", "Array", "ConvParams", "OpImpl",
           "constant_value",
           "conv_params", "engine", "implementation", "node_function", "pool_output_sizes",
           "reshape_target", "resolve_pads", "shape_fix", "shape_of"]
