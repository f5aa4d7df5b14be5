"""Quantization ops (default domain, opsets 10 to 21): ``QuantizeLinear``,
``DequantizeLinear`` and ``DynamicQuantizeLinear``, the integer kernels ``MatMulInteger`` and
``ConvInteger``, and the requantizing ``QLinearMatMul`` and ``QLinearConv``.

Quantized values are 8-bit (``uint8``, ``int8``; ``QuantizeLinear`` also makes 16-bit ones,
``DequantizeLinear`` reads any integer type: int32, 16-bit, int4) with a float32 scale and an
integer zero point, per tensor or per axis (a 1-D scale along ``axis``). Blocked
quantization (``block_size``, opset 21) is dequantized (the int4 weights of weight-only
models fold through it) but not quantized.
Rounding is half to even and results saturate to the output type's range. The integer ops
accumulate exactly; the ``QLinear`` ops then scale the accumulator by
``a_scale * b_scale / y_scale`` in float32, round, add the output zero point and saturate,
as onnxruntime does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tunecache.compiler.kinds.conv2d import conv2d_nchw
from tunecache.compiler.onnx_ops.kernel_ops import conv_params
from tunecache.compiler.onnx_ops.reference import reference_call
from tunecache.compiler.onnx_ops.registry import (
    ONNX_DTYPES,
    Array,
    as_array,
    norm_axis,
    opt_input,
    register,
)

__all__ = ["QUANTIZED_RANGES", "dequantize_linear", "dynamic_quantize_linear",
           "quantize_linear", "requantize"]

QUANTIZED_RANGES: dict[np.dtype, tuple[int, int]] = {
    np.dtype(t): (int(np.iinfo(t).min), int(np.iinfo(t).max))
    for t in (np.uint8, np.int8, np.uint16, np.int16)
}
"""The quantized element types ``QuantizeLinear`` produces, with their saturation ranges."""

_F32 = np.dtype(np.float32)


def _axis_param(p: Array, rank: int, axis: int) -> Array:
    """A scale or zero point shaped to broadcast against a tensor of ``rank`` dims: a scalar
    (or one-element vector) per tensor, a 1-D one along ``axis``."""
    if p.size == 1:
        return p.reshape(())
    if p.ndim != 1:
        raise ValueError(f"a scale or zero point of shape {list(p.shape)} is neither per "
                         "tensor nor per axis (blocked quantization needs block_size)")
    shape = [1] * rank
    shape[norm_axis(axis, rank)] = p.shape[0]
    return p.reshape(shape)


def _block_param(p: Array, shape: Sequence[int], axis: int, block_size: int) -> Array:
    """A blocked scale or zero point (one entry per ``block_size`` elements along ``axis``,
    the tensor's other dims as they are) repeated to the tensor's ``shape``."""
    axis = norm_axis(axis, len(shape))
    blocks = -(-shape[axis] // block_size)
    expected = (*shape[:axis], blocks, *shape[axis + 1:])
    if tuple(p.shape) != expected:
        raise ValueError(f"a blocked scale or zero point of shape {list(p.shape)} does not fit "
                         f"a tensor of shape {list(shape)} (block_size {block_size} along axis "
                         f"{axis}: {list(expected)})")
    return np.repeat(p, block_size, axis=axis)[(slice(None),) * axis + (slice(0, shape[axis]),)]


def _check_block_size(attrs: Mapping[str, Any], op: str) -> None:
    if int(attrs.get("block_size", 0)):
        raise ValueError(f"{op} with block_size={attrs['block_size']} (blocked quantization) "
                         "is not supported")


def _saturate(v: Array, dtype: np.dtype) -> Array:
    """Integer-valued ``v`` clipped to ``dtype``'s range and converted."""
    if dtype not in QUANTIZED_RANGES:
        raise ValueError(f"quantized type {dtype} is not supported (uint8, int8, uint16, int16)")
    lo, hi = QUANTIZED_RANGES[dtype]
    return as_array(np.clip(v, lo, hi), dtype)


def quantize_linear(x: Array, scale: Array, zero_point: Array | None, axis: int = 1,
                    dtype: np.dtype | None = None) -> Array:
    """ONNX ``QuantizeLinear``: ``saturate(round(x / scale) + zero_point)``, rounding half to
    even, in ``zero_point``'s type (``dtype`` when there is none, else uint8).

    ``scale`` and ``zero_point`` are scalars (per tensor) or 1-D along ``axis``.
    """
    out = zero_point.dtype if zero_point is not None else np.dtype(dtype or np.uint8)
    s = _axis_param(as_array(scale, _F32), x.ndim, axis)
    # float32 division, as onnxruntime does (a multiply by 1/scale rounds ties differently).
    v = np.rint(as_array(x, _F32) / s)
    if zero_point is not None:
        v += _axis_param(as_array(zero_point, _F32), x.ndim, axis)
    return _saturate(v, out)


def dequantize_linear(x: Array, scale: Array, zero_point: Array | None,
                      axis: int = 1, block_size: int = 0) -> Array:
    """ONNX ``DequantizeLinear``: ``(x - zero_point) * scale`` in ``scale``'s float type.

    ``scale`` and ``zero_point`` are scalars, 1-D along ``axis``, or with ``block_size``
    (opset 21) of ``x``'s rank, one entry per block along ``axis``. The difference is taken
    in integers (exact for int32 inputs too), then made float32.
    """
    def shaped(p: Array) -> Array:
        if block_size:
            return _block_param(p, x.shape, axis, block_size)
        return _axis_param(p, x.ndim, axis)

    s = shaped(as_array(scale))
    # 8- and 16-bit differences are exact in float32 (below 2**24): no int64 pass, which
    # took 3 ms for one of BERT-base's FFN activations.
    wide = np.dtype(np.int64) if x.dtype.itemsize > 2 else _F32
    q = x.astype(wide)
    if zero_point is not None:
        q = q - shaped(as_array(zero_point, wide))
    y = q.astype(_F32, copy=False) * s.astype(_F32)
    return as_array(y, s.dtype if s.dtype.kind == "f" else _F32)


def dynamic_quantize_linear(x: Array) -> tuple[Array, Array, Array]:
    """ONNX ``DynamicQuantizeLinear``: ``x`` as uint8 with the scale and zero point that map
    its range, widened to include 0, onto [0, 255]; returns ``(y, y_scale, y_zero_point)``.

    An input whose range is only 0 (all zeros, or empty) gets scale 1 rather than a division
    by zero, as onnxruntime does.
    """
    f = np.float32
    x = as_array(x, _F32)
    lo = f(min(0.0, float(x.min()))) if x.size else f(0)
    hi = f(max(0.0, float(x.max()))) if x.size else f(0)
    scale = f(1) if hi == lo else f((hi - lo) / f(255))
    zp = np.rint(np.clip(f(0) - lo / scale, f(0), f(255)))
    y = np.clip(np.rint(x / scale) + zp, 0, 255)
    return as_array(y, np.dtype(np.uint8)), as_array(scale), as_array(zp, np.dtype(np.uint8))


def requantize(acc: Array, multiplier: Array, zero_point: Array | None,
               dtype: np.dtype) -> Array:
    """An integer accumulator (exact, in any numeric dtype) scaled by ``multiplier`` in
    float32, rounded half to even, shifted by ``zero_point`` and saturated to ``dtype``."""
    v = np.rint(acc.astype(_F32) * multiplier)
    if zero_point is not None:
        v += as_array(zero_point, _F32)
    return _saturate(v, dtype)


def _centered(q: Array, zero_point: Array | None) -> Array:
    """``q - zero_point`` in float64 (``zero_point`` already shaped to broadcast)."""
    v = q.astype(np.float64)
    return v if zero_point is None else v - zero_point.astype(np.float64)


def _vector_param(p: Array, rows: bool) -> Array:
    """A MatMul operand's zero point or scale: a 1-D one is per row of A (``rows``) or per
    column of B; scalars and full-rank ones broadcast as they are."""
    if p.size == 1:
        return p.reshape(())
    return p.reshape(-1, 1) if rows and p.ndim == 1 else p


def _int_matmul(a: Array, a_zp: Array | None, b: Array, b_zp: Array | None) -> Array:
    """``(a - a_zp) @ (b - b_zp)`` as exact integers held in float64.

    float64 BLAS is exact here: 8-bit operands less their zero points stay within 2**9, so
    every partial sum stays below 2**53 for any inner dimension under 2**35.
    """
    a_c = _centered(a, None if a_zp is None else _vector_param(a_zp, rows=True))
    b_c = _centered(b, None if b_zp is None else _vector_param(b_zp, rows=False))
    return as_array(np.matmul(a_c, b_c))


def _int_conv(x: Array, x_zp: Array | None, w: Array, w_zp: Array | None,
              attrs: Mapping[str, Any]) -> Array:
    """The 1-D or 2-D convolution of ``x - x_zp`` by ``w - w_zp`` as exact integers held in
    float64 (see :func:`_int_matmul`), in ``(N, M, H, W)`` form (height 1 for 1-D).

    Subtracting the zero point first makes the padding the real value 0, that is, the zero
    point in the quantized domain, as the spec's reference and onnxruntime pad.
    """
    if x.ndim not in (3, 4):
        raise ValueError(f"only 1-D and 2-D convolutions are supported (input rank {x.ndim})")
    if w_zp is not None and w_zp.size > 1:
        w_zp = w_zp.reshape(-1, *([1] * (w.ndim - 1)))
    x_c = _centered(x, None if x_zp is None else x_zp.reshape(()))
    w_c = _centered(w, w_zp)
    if x.ndim == 3:  # a 1-D convolution is a 2-D one of height 1
        x_c, w_c = x_c[:, :, None, :], w_c[:, :, None, :]
    p = conv_params(attrs, x_c.shape, w_c.shape)
    return conv2d_nchw(x_c, w_c, None, p.stride, p.pads, p.dilation, p.groups)


def _int32(acc: Array) -> Array:
    return as_array(acc.astype(np.int64), np.dtype(np.int32))


# -- registered implementations -------------------------------------------------------------


@register("QuantizeLinear")
def _quantize_op(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                 opset: int) -> list[Array]:
    x, scale = inputs[0], inputs[1]
    assert x is not None and scale is not None
    _check_block_size(attrs, "QuantizeLinear")
    zp = opt_input(inputs, 2)
    dtype = None
    target = ONNX_DTYPES.get(int(attrs.get("output_dtype", 0))) or (
        zp.dtype if zp is not None else None)
    if target is not None and target not in QUANTIZED_RANGES:  # float8, int4, …
        return reference_call("QuantizeLinear", inputs, attrs, opset)
    if attrs.get("output_dtype"):
        code = int(attrs["output_dtype"])
        dtype = ONNX_DTYPES.get(code)
        if dtype not in QUANTIZED_RANGES:
            raise ValueError(f"QuantizeLinear output_dtype {code} is not supported "
                             "(uint8, int8, uint16, int16)")
        if zp is not None and zp.dtype != dtype:
            raise ValueError(f"QuantizeLinear output_dtype {dtype} differs from the zero "
                             f"point's type {zp.dtype}")
    return [quantize_linear(x, scale, zp, int(attrs.get("axis", 1)), dtype)]


@register("DequantizeLinear")
def _dequantize_op(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                   opset: int) -> list[Array]:
    x, scale = inputs[0], inputs[1]
    assert x is not None and scale is not None
    if x.dtype.kind not in "iu":  # float8, int4, …: ONNX's own rounding rules
        return reference_call("DequantizeLinear", inputs, attrs, opset)
    return [dequantize_linear(x, scale, opt_input(inputs, 2), int(attrs.get("axis", 1)),
                              int(attrs.get("block_size", 0)))]


@register("DynamicQuantizeLinear")
def _dynamic_quantize_op(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                         opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    return list(dynamic_quantize_linear(x))


@register("MatMulInteger")
def _matmul_integer(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                    opset: int) -> list[Array]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    return [_int32(_int_matmul(a, opt_input(inputs, 2), b, opt_input(inputs, 3)))]


@register("ConvInteger")
def _conv_integer(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                  opset: int) -> list[Array]:
    x, w = inputs[0], inputs[1]
    assert x is not None and w is not None
    y = _int_conv(x, opt_input(inputs, 2), w, opt_input(inputs, 3), attrs)
    return [_int32(y[:, :, 0, :] if x.ndim == 3 else y)]


def _multiplier(*scales: Array) -> Array:
    """``s0 * s1 / s2`` in float32, left to right, as onnxruntime computes it."""
    s0, s1, s2 = (as_array(s, _F32) for s in scales)
    return as_array(s0 * s1 / s2, _F32)


def _out_dtype(zero_point: Array | None, operand: Array) -> np.dtype:
    return zero_point.dtype if zero_point is not None else operand.dtype


@register("QLinearMatMul")
def _qlinear_matmul(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                    opset: int) -> list[Array]:
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale = inputs[:7]
    assert a is not None and b is not None
    assert a_scale is not None and b_scale is not None and y_scale is not None
    y_zp = opt_input(inputs, 7)
    acc = _int_matmul(a, a_zp, b, b_zp)
    scale = _multiplier(_vector_param(a_scale, rows=True), _vector_param(b_scale, rows=False),
                        y_scale.reshape(()))
    return [requantize(acc, scale, y_zp, _out_dtype(y_zp, a))]


@register("QLinearConv")
def _qlinear_conv(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                  opset: int) -> list[Array]:
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale = inputs[:7]
    assert x is not None and w is not None
    assert x_scale is not None and w_scale is not None and y_scale is not None
    y_zp, bias = opt_input(inputs, 7), opt_input(inputs, 8)
    acc = _int_conv(x, x_zp, w, w_zp, attrs)
    channels = (1, -1, 1, 1)
    if bias is not None:
        acc = acc + bias.astype(np.float64).reshape(channels)
    scale = _multiplier(x_scale.reshape(()), w_scale.reshape(-1), y_scale.reshape(()))
    y = requantize(acc, scale.reshape(channels), y_zp, _out_dtype(y_zp, x))
    return [y[:, :, 0, :] if x.ndim == 3 else y]
