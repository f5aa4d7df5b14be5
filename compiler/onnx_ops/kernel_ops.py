"""The kernel ops' numpy fallbacks, for nodes the frontend does not turn into kernels:
``MatMul``, ``Gemm`` and ``Conv`` (1-D or 2-D, grouped); :func:`conv_params` resolves a
``Conv`` node's strides, dilations, pads (``auto_pad`` included) and groups, for the
convolution lowering too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tunecache.compiler.kinds.conv2d import conv2d_nchw
from tunecache.compiler.onnx_ops.pooling import resolve_pads
from tunecache.compiler.onnx_ops.registry import (
    DECLINES,
    Array,
    as_array,
    opt_input,
    register,
)


@register("MatMul")
def _matmul(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    return [as_array(np.matmul(a, b), a.dtype)]


@register("Gemm")
def _gemm(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    a, b = inputs[0], inputs[1]
    c = opt_input(inputs, 2)
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
    return [as_array(y, a.dtype)]


def _three_d(attrs: Mapping[str, Any], outputs: Sequence[str]) -> bool:
    """A 3-D convolution by its attributes (a grouped one, or weights computed at run time:
    the rewrite takes the rest), which the reference runs, set up once with the plan."""
    lengths = {"kernel_shape": 2, "strides": 2, "dilations": 2, "pads": 4}
    return any(len(attrs.get(name, ())) > most for name, most in lengths.items())


DECLINES["Conv"] = _three_d


@register("Conv")
def _conv(inputs: Sequence[Array | None], attrs: Mapping[str, Any], opset: int) -> list[Array]:
    x, w = inputs[0], inputs[1]
    bias = opt_input(inputs, 2)
    assert x is not None and w is not None
    if x.ndim > 4:  # a 3-D node whose attributes did not say so (DECLINES below)
        from tunecache.compiler.onnx_ops.reference import reference_function

        names = [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)]
        return reference_function("Conv", names, ["y"], attrs, opset)(inputs)
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
