"""numpy implementations of the ONNX operators the executor runs outside generated kernels.

Each implementation is ``impl(inputs, attrs, opset) -> outputs``: ``inputs`` in the node's
order (``None`` for an omitted optional input), ``attrs`` the node's attributes as plain
Python values (ints, floats, strings, tuples, numpy arrays for tensors), ``opset`` the model's
default-domain opset, which decides between attribute and input forms (``Slice`` before and
after opset 10, ``Squeeze``/``Unsqueeze``/``ReduceSum`` axes from 13, ``ReduceMean`` axes from
18, ``Clip``/``Pad`` bounds from 11, …). Results are float32 where the inputs are float32,
with ONNX's semantics (broadcasting, negative axes, clamped slice bounds).

:data:`OPS` maps op type to implementation; :func:`implementation` looks one up. The
``MatMul``, ``Gemm`` and ``Conv`` implementations here are the fallback for nodes the frontend
does not turn into kernels (and the numpy path of kernel ops lives in
:mod:`tunecache.compiler.executor`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tunecache.compiler.kinds.conv2d import conv2d_nchw

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


def _register(*names: str) -> Callable[[OpImpl], OpImpl]:
    def wrap(fn: OpImpl) -> OpImpl:
        for name in names:
            OPS[name] = fn
        return fn
    return wrap


def implementation(op_type: str) -> OpImpl | None:
    """The numpy implementation of ``op_type`` (default domain), or None."""
    return OPS.get(op_type)


def _arr(x: Any, dtype: np.dtype | None = None) -> Array:
    # numpy ufuncs on 0-d arrays return scalars; keep everything an ndarray.
    out = np.asarray(x)
    if dtype is not None and out.dtype != dtype:
        out = out.astype(dtype)
    return out


def _ints(x: Array | Sequence[int] | None) -> tuple[int, ...] | None:
    if x is None:
        return None
    return tuple(int(v) for v in np.asarray(x).reshape(-1))


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _opt(inputs: Sequence[Array | None], i: int) -> Array | None:
    return inputs[i] if len(inputs) > i else None


# -- elementwise ---------------------------------------------------------------------------


def _unary(fn: Callable[[Array], Any]) -> OpImpl:
    def impl(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
        x = inputs[0]
        assert x is not None
        return [_arr(fn(x), x.dtype)]
    return impl


# Abramowitz & Stegun 7.1.26: erf(a) = 1 - t(p1 + t(p2 + ...)) e^(-a^2), t = 1 / (1 + 0.3275911 a)
_ERF_P = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(x: Array) -> Array:
    """erf; float32 by a rational approximation (absolute error below 1e-6, 4x faster
    than scipy's float32 erf on BERT's GELU), other dtypes by scipy."""
    if x.dtype != np.float32:
        from scipy.special import erf

        return np.asarray(erf(x))
    f = np.float32
    a = np.abs(x)
    t = a * f(0.3275911)
    t += f(1)
    np.reciprocal(t, out=t)
    y = t * f(_ERF_P[4])
    for coefficient in reversed(_ERF_P[:4]):
        y += f(coefficient)
        y *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    y *= a
    np.subtract(f(1), y, out=y)
    return np.copysign(y, x, out=y)


_UNARY: dict[str, Callable[[Array], Any]] = {
    "Relu": lambda x: np.maximum(x, x.dtype.type(0)),
    "Sqrt": np.sqrt, "Tanh": np.tanh, "Exp": np.exp, "Log": np.log, "Abs": np.abs,
    "Neg": np.negative, "Floor": np.floor, "Ceil": np.ceil, "Erf": _erf,
    "Reciprocal": lambda x: np.reciprocal(x) if x.dtype.kind == "f" else 1 // x,
    "Sigmoid": lambda x: np.reciprocal(x.dtype.type(1) + np.exp(-x)),
    "Not": np.logical_not,
    "Identity": lambda x: x,
    "Cos": np.cos, "Sin": np.sin, "Sign": np.sign,
}
for _name, _fn in _UNARY.items():
    OPS[_name] = _unary(_fn)


@_register("IsNaN")
def _isnan(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    return [_arr(np.isnan(x))]


@_register("IsInf")
def _isinf(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    positive, negative = int(attrs.get("detect_positive", 1)), int(attrs.get("detect_negative", 1))
    return [_arr(np.isinf(x) & (((x > 0) & bool(positive)) | ((x < 0) & bool(negative))))]


def _div(a: Array, b: Array) -> Array:
    if a.dtype.kind in "iu":
        # ONNX integer division truncates toward zero (C semantics), numpy's // floors.
        return np.trunc(np.true_divide(a, b)).astype(a.dtype)
    return np.true_divide(a, b)


_BINARY: dict[str, Callable[[Array, Array], Any]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _div,
    "Pow": np.power, "Equal": np.equal, "Less": np.less, "Greater": np.greater,
    "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal,
    "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
}


def _binary(name: str) -> OpImpl:
    fn = _BINARY[name]
    keeps_type = name in ("Add", "Sub", "Mul", "Div", "Pow")

    def impl(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        # Pow's result has the base's type; the other arithmetic ops have equal input types.
        return [_arr(fn(a, b), a.dtype if keeps_type else None)]
    return impl


for _name in _BINARY:
    OPS[_name] = _binary(_name)


@_register("Mod")
def _mod(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    # fmod=1 (required for floats): the sign of the dividend, as C's fmod; else the divisor's.
    fn = np.fmod if attrs.get("fmod", 0) else np.mod
    return [_arr(fn(a, b), a.dtype)]


def _variadic(fn: Callable[[Array, Array], Any]) -> OpImpl:
    def impl(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
        arrays = [x for x in inputs if x is not None]
        out = arrays[0]
        for x in arrays[1:]:
            out = fn(out, x)
        return [_arr(out, arrays[0].dtype)]
    return impl


OPS["Sum"] = _variadic(np.add)
OPS["Max"] = _variadic(np.maximum)
OPS["Min"] = _variadic(np.minimum)


@_register("Mean")
def _mean(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    arrays = [x for x in inputs if x is not None]
    total = OPS["Sum"](arrays, attrs, opset)[0]
    return [_arr(total / total.dtype.type(len(arrays)), arrays[0].dtype)]


@_register("Where")
def _where(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    c, x, y = inputs
    assert c is not None and x is not None and y is not None
    return [_arr(np.where(c, x, y), x.dtype)]


@_register("LeakyRelu")
def _leaky_relu(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    alpha = x.dtype.type(attrs.get("alpha", 0.01))
    return [_arr(np.where(x >= 0, x, x * alpha), x.dtype)]


@_register("HardSigmoid")
def _hard_sigmoid(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                  opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    t = x.dtype.type
    y = np.clip(x * t(attrs.get("alpha", 0.2)) + t(attrs.get("beta", 0.5)), t(0), t(1))
    return [_arr(y, x.dtype)]


@_register("HardSwish")
def _hard_swish(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    t = x.dtype.type
    return [_arr(x * np.clip(x / t(6) + t(0.5), t(0), t(1)), x.dtype)]


@_register("Gelu")
def _gelu(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    t = x.dtype.type
    if attrs.get("approximate", "none") == "tanh":
        inner = t(math.sqrt(2 / math.pi)) * (x + t(0.044715) * x * x * x)
        return [_arr(t(0.5) * x * (t(1) + np.tanh(inner)), x.dtype)]
    return [_arr(t(0.5) * x * (t(1) + _erf(x / t(math.sqrt(2)))), x.dtype)]


@_register("Clip")
def _clip(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    if opset < 11:
        lo: Any = attrs.get("min", -np.inf)
        hi: Any = attrs.get("max", np.inf)
    else:
        lo, hi = _opt(inputs, 1), _opt(inputs, 2)
    out = x
    if lo is not None:
        out = np.maximum(out, np.asarray(lo).astype(x.dtype) if x.dtype.kind != "f"
                         else x.dtype.type(np.asarray(lo)))
    if hi is not None:
        out = np.minimum(out, np.asarray(hi).astype(x.dtype) if x.dtype.kind != "f"
                         else x.dtype.type(np.asarray(hi)))
    return [_arr(out, x.dtype)]


@_register("Cast")
def _cast(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    return [_arr(x, ONNX_DTYPES[int(attrs["to"])])]


@_register("Dropout")
def _dropout(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    # Inference: the identity, and an all-true mask for the optional second output.
    x = inputs[0]
    assert x is not None
    return [x, np.ones(x.shape, dtype=np.bool_)]


# -- normalisation and activations over axes -----------------------------------------------


def _softmax_family(log: bool) -> OpImpl:
    def impl(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
        x = inputs[0]
        assert x is not None
        if opset < 13:
            # Before opset 13 the input is coerced to 2-D at `axis` (default 1) and the
            # softmax runs over the flattened trailing block.
            axis = _axis(int(attrs.get("axis", 1)), x.ndim)
            flat = x.reshape(math.prod(x.shape[:axis]), -1)
            return [_arr(_softmax(flat, 1, log).reshape(x.shape), x.dtype)]
        axis = _axis(int(attrs.get("axis", -1)), x.ndim)
        return [_arr(_softmax(x, axis, log), x.dtype)]
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


@_register("BatchNormalization")
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
    return [_arr(y, x.dtype)]


def _inplace(ufunc: np.ufunc, a: Array, b: Array) -> Array:
    """``ufunc(a, b)``, written into ``a`` (a temporary of the caller's) when the result
    has ``a``'s shape and dtype: saves a full-size allocation per step."""
    if a.shape == np.broadcast_shapes(a.shape, b.shape) and a.dtype == np.result_type(a, b):
        return np.asarray(ufunc(a, b, out=a))
    return np.asarray(ufunc(a, b))


@_register("LayerNormalization")
def _layer_norm(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                opset: int) -> list[Array]:
    x, scale = inputs[0], inputs[1]
    bias = _opt(inputs, 2)
    assert x is not None and scale is not None
    axis = _axis(int(attrs.get("axis", -1)), x.ndim)
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
    return [_arr(y, x.dtype), _arr(mean, x.dtype), _arr(inv_std, x.dtype)]


@_register("LRN")
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
    return [_arr(x / (t(bias) + t(alpha / size) * window) ** t(beta), x.dtype)]


# -- reductions ----------------------------------------------------------------------------


def _reduce(fn: Callable[..., Any], axes_input_from: int) -> OpImpl:
    def impl(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
        x = inputs[0]
        assert x is not None
        keepdims = bool(attrs.get("keepdims", 1))
        axes = _ints(_opt(inputs, 1)) if opset >= axes_input_from else _ints(attrs.get("axes"))
        if not axes:
            if opset >= axes_input_from and attrs.get("noop_with_empty_axes", 0):
                return [x]
            axes = tuple(range(x.ndim))
        norm = tuple(_axis(a, x.ndim) for a in axes)
        return [_arr(fn(x, axis=norm, keepdims=keepdims), x.dtype)]
    return impl


OPS["ReduceMean"] = _reduce(np.mean, 18)
OPS["ReduceMax"] = _reduce(np.max, 18)
OPS["ReduceMin"] = _reduce(np.min, 18)
OPS["ReduceProd"] = _reduce(np.prod, 18)
OPS["ReduceSum"] = _reduce(np.sum, 13)


def _arg(fn: Callable[..., Any]) -> OpImpl:
    def impl(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
        x = inputs[0]
        assert x is not None
        axis = _axis(int(attrs.get("axis", 0)), x.ndim)
        if attrs.get("select_last_index", 0):
            flipped = np.flip(x, axis)
            out = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            out = fn(x, axis=axis)
        if attrs.get("keepdims", 1):
            out = np.expand_dims(out, axis)
        return [_arr(out, np.dtype(np.int64))]
    return impl


OPS["ArgMax"] = _arg(np.argmax)
OPS["ArgMin"] = _arg(np.argmin)


# -- pooling -------------------------------------------------------------------------------


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


def _pool(inputs: Sequence[Array | None], attrs: Mapping[str, Any], mode: str) -> Array:
    x = inputs[0]
    assert x is not None
    nsp = x.ndim - 2
    kernel = tuple(int(k) for k in attrs["kernel_shape"])
    strides = tuple(attrs.get("strides", (1,) * nsp))
    dilations = tuple(attrs.get("dilations", (1,) * nsp))
    pads = resolve_pads(str(attrs.get("auto_pad", "NOTSET")), x.shape[2:], kernel, strides,
                        dilations, attrs.get("pads"))
    ceil_mode = bool(attrs.get("ceil_mode", 0))
    extra = []
    for i in range(nsp):
        extent = dilations[i] * (kernel[i] - 1) + 1
        span = x.shape[2 + i] + pads[i] + pads[nsp + i] - extent
        out = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (out - 1) * strides[i] >= x.shape[2 + i] + pads[i]:
            out -= 1  # the last window must start inside the input or its begin padding
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
        return _arr(total, x.dtype)
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
    return _arr(total / counts, x.dtype)


@_register("MaxPool")
def _max_pool(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    return [_pool(inputs, attrs, "max")]


@_register("AveragePool")
def _avg_pool(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    return [_pool(inputs, attrs, "avg")]


@_register("GlobalAveragePool")
def _global_avg(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    return [_arr(np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True), x.dtype)]


@_register("GlobalMaxPool")
def _global_max(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    return [_arr(np.max(x, axis=tuple(range(2, x.ndim)), keepdims=True), x.dtype)]


# -- shape manipulation --------------------------------------------------------------------


@_register("Reshape")
def _reshape(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x, shape_in = inputs[0], inputs[1]
    assert x is not None and shape_in is not None
    return [x.reshape(reshape_target(x.shape, _ints(shape_in) or (),
                                     bool(attrs.get("allowzero", 0))))]


def reshape_target(in_shape: Sequence[int], shape: Sequence[int], allowzero: bool) -> tuple[int, ...]:
    """ONNX Reshape's output shape: ``0`` copies the input dim (unless allowzero), ``-1`` infers."""
    out = [in_shape[i] if (v == 0 and not allowzero) else v for i, v in enumerate(shape)]
    if -1 in out:
        known = math.prod(v for v in out if v != -1)
        out[out.index(-1)] = math.prod(in_shape) // known if known else 0
    return tuple(out)


@_register("Flatten")
def _flatten(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    axis = _axis(int(attrs.get("axis", 1)), x.ndim)
    return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


@_register("Transpose")
def _transpose(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
               opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    perm = attrs.get("perm")
    return [np.transpose(x, tuple(perm) if perm is not None else None)]


@_register("Squeeze")
def _squeeze(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    axes = _ints(_opt(inputs, 1)) if opset >= 13 else _ints(attrs.get("axes"))
    if axes is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    return [np.squeeze(x, axis=tuple(_axis(a, x.ndim) for a in axes))]


@_register("Unsqueeze")
def _unsqueeze(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
               opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    axes = _ints(_opt(inputs, 1)) if opset >= 13 else _ints(attrs.get("axes"))
    rank = x.ndim + len(axes or ())
    out = x
    for a in sorted(_axis(a, rank) for a in axes or ()):
        out = np.expand_dims(out, a)
    return [out]


@_register("Concat")
def _concat(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    arrays = [x for x in inputs if x is not None]
    return [np.concatenate(arrays, axis=int(attrs["axis"]))]


@_register("Split")
def _split(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    axis = _axis(int(attrs.get("axis", 0)), x.ndim)
    split = _ints(_opt(inputs, 1)) if opset >= 13 else _ints(attrs.get("split"))
    if not split:
        parts = int(attrs.get("num_outputs", 1))
        size = -(-x.shape[axis] // parts)
        split = tuple(min(size, x.shape[axis] - i * size) for i in range(parts))
    bounds = np.cumsum(split)[:-1]
    return list(np.split(x, bounds, axis=axis))


@_register("Slice")
def _slice(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    if opset < 10:
        starts, ends = _ints(attrs["starts"]), _ints(attrs["ends"])
        axes, steps = _ints(attrs.get("axes")), None
    else:
        starts, ends = _ints(inputs[1]), _ints(inputs[2])
        axes, steps = _ints(_opt(inputs, 3)), _ints(_opt(inputs, 4))
    assert starts is not None and ends is not None
    axes = axes or tuple(range(len(starts)))
    steps = steps or (1,) * len(starts)
    index: list[slice] = [slice(None)] * x.ndim
    for a, b, e, s in zip(axes, starts, ends, steps, strict=True):
        # Python slicing clamps out-of-range bounds the way ONNX specifies (INT64 extremes
        # included, for negative steps too).
        index[_axis(a, x.ndim)] = slice(b, e, s)
    return [x[tuple(index)]]


@_register("Gather")
def _gather(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x, idx = inputs[0], inputs[1]
    assert x is not None and idx is not None
    axis = _axis(int(attrs.get("axis", 0)), x.ndim)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return [np.take(x, idx, axis=axis)]


@_register("GatherElements")
def _gather_elements(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                     opset: int) -> list[Array]:
    x, idx = inputs[0], inputs[1]
    assert x is not None and idx is not None
    axis = _axis(int(attrs.get("axis", 0)), x.ndim)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return [np.take_along_axis(x, idx, axis=axis)]


@_register("GatherND")
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


@_register("Trilu")
def _trilu(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    k_in = _opt(inputs, 1)
    k = int(k_in.reshape(-1)[0]) if k_in is not None else 0
    return [np.triu(x, k) if attrs.get("upper", 1) else np.tril(x, k)]


@_register("CumSum")
def _cumsum(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x, axis_in = inputs[0], inputs[1]
    assert x is not None and axis_in is not None
    axis = _axis(int(axis_in.reshape(-1)[0]), x.ndim)
    y = np.flip(x, axis) if attrs.get("reverse", 0) else x
    out = np.cumsum(y, axis=axis, dtype=x.dtype)
    if attrs.get("exclusive", 0):
        out = np.concatenate([np.zeros_like(np.take(out, [0], axis=axis)),
                              np.take(out, range(out.shape[axis] - 1), axis=axis)], axis=axis)
    return [np.flip(out, axis) if attrs.get("reverse", 0) else out]


@_register("Shape")
def _shape(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    return [shape_of(x.shape, attrs)]


def shape_of(shape: Sequence[int], attrs: Mapping[str, Any]) -> Array:
    """ONNX Shape's output (``start``/``end`` from opset 15) for a known input shape."""
    rank = len(shape)
    start = int(attrs.get("start", 0))
    end = attrs.get("end")
    s = max(0, min(rank, _axis(start, rank)))
    e = rank if end is None else max(0, min(rank, _axis(int(end), rank)))
    return np.asarray(shape[s:e], dtype=np.int64).reshape(-1)


@_register("Size")
def _size(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    return [np.asarray(x.size, dtype=np.int64)]


@_register("Expand")
def _expand(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x, shape = inputs[0], inputs[1]
    assert x is not None and shape is not None
    target = np.broadcast_shapes(x.shape, _ints(shape) or ())
    return [np.array(np.broadcast_to(x, target))]


@_register("Tile")
def _tile(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x, reps = inputs[0], inputs[1]
    assert x is not None and reps is not None
    return [np.tile(x, _ints(reps) or ())]


@_register("Pad")
def _pad(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x = inputs[0]
    assert x is not None
    mode = str(attrs.get("mode", "constant"))
    if opset < 11:
        pads = _ints(attrs["pads"])
        value: Any = attrs.get("value", 0.0)
        axes = None
    else:
        pads = _ints(inputs[1])
        cv = _opt(inputs, 2)
        value = cv.reshape(-1)[0] if cv is not None and cv.size else 0
        axes = _ints(_opt(inputs, 3))
    assert pads is not None
    axes = tuple(_axis(a, x.ndim) for a in axes) if axes else tuple(range(x.ndim))
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


@_register("Constant")
def _constant(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    return [constant_value(attrs)]


def constant_value(attrs: Mapping[str, Any]) -> Array:
    """The value of a ``Constant`` node from whichever attribute holds it."""
    if "value" in attrs:
        return np.asarray(attrs["value"])
    if "value_float" in attrs:
        return np.asarray(attrs["value_float"], dtype=np.float32)
    if "value_floats" in attrs:
        return np.asarray(attrs["value_floats"], dtype=np.float32)
    if "value_int" in attrs:
        return np.asarray(attrs["value_int"], dtype=np.int64)
    if "value_ints" in attrs:
        return np.asarray(attrs["value_ints"], dtype=np.int64)
    raise ValueError(f"Constant with unsupported attribute(s) {', '.join(attrs) or 'none'}")


@_register("ConstantOfShape")
def _constant_of_shape(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                       opset: int) -> list[Array]:
    shape = _ints(inputs[0]) or ()
    value = attrs.get("value")
    fill = np.asarray(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    return [np.full(shape, fill[0], dtype=fill.dtype)]


@_register("Range")
def _range(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    start, limit, delta = inputs
    assert start is not None and limit is not None and delta is not None
    return [np.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype)]


# -- the kernel ops, for nodes that are not turned into kernels ----------------------------


@_register("MatMul")
def _matmul(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    return [_arr(np.matmul(a, b), a.dtype)]


@_register("Gemm")
def _gemm(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    a, b = inputs[0], inputs[1]
    c = _opt(inputs, 2)
    assert a is not None and b is not None
    if attrs.get("transA", 0):
        a = a.T
    if attrs.get("transB", 0):
        b = b.T
    t = a.dtype.type
    y = np.matmul(a, b)
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = y * t(alpha)
    if c is not None and beta != 0.0:
        y = y + (c * t(beta) if beta != 1.0 else c)
    return [_arr(y, a.dtype)]


@_register("Conv")
def _conv(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x, w = inputs[0], inputs[1]
    bias = _opt(inputs, 2)
    assert x is not None and w is not None
    one_d = x.ndim == 3
    if one_d:  # a 1-D convolution is a 2-D one of height 1
        x, w = x[:, :, None, :], w[:, :, None, :]
    p = conv_params(attrs, x.shape, w.shape)
    y = conv2d_nchw(x, w, bias, p.stride, p.pads, p.dilation, p.groups)
    return [y[:, :, 0, :] if one_d else y]


class ConvParams:
    """Resolved 2-D convolution parameters: stride, dilation (h, w), pads (t, l, b, r), groups."""

    __slots__ = ("dilation", "groups", "pads", "stride")

    def __init__(self, stride: tuple[int, int], pads: tuple[int, int, int, int],
                 dilation: tuple[int, int], groups: int) -> None:
        self.stride, self.pads, self.dilation, self.groups = stride, pads, dilation, groups


def conv_params(attrs: Mapping[str, Any], x_shape: Sequence[int],
                w_shape: Sequence[int]) -> ConvParams:
    """A 2-D ``Conv`` node's parameters with ``auto_pad`` turned into explicit pads.

    ``x_shape`` is ``(N, C, H, W)`` and ``w_shape`` ``(F, C/groups, R, S)``; a 1-D node's
    attributes (one entry per list) are widened to height 1 first.
    """
    def pair(name: str, default: int) -> tuple[int, int]:
        v = tuple(int(i) for i in attrs.get(name, ()))
        if not v:
            return default, default
        return (1, v[0]) if len(v) == 1 else (v[0], v[1])

    stride = pair("strides", 1)
    dilation = pair("dilations", 1)
    raw = attrs.get("pads")
    if raw is not None and len(raw) == 2:  # 1-D: (begin, end) -> (0, begin, 0, end)
        raw = (0, raw[0], 0, raw[1])
    kernel = attrs.get("kernel_shape") or tuple(w_shape[2:])
    if len(kernel) == 1:
        kernel = (1, kernel[0])
    pads = resolve_pads(str(attrs.get("auto_pad", "NOTSET")), x_shape[2:], kernel, stride,
                        dilation, raw)
    return ConvParams(stride, (pads[0], pads[1], pads[2], pads[3]), dilation,
                      int(attrs.get("group", 1)))


