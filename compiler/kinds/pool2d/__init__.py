"""The ``pool2d`` kind: 2-D max or average pooling over NCHW planes (ONNX ``MaxPool`` /
``AveragePool``; global pooling is the window covering the plane, ``R=H, S=W``).

Signature: ``X[N,C,H,W] -> Y[N,C,P,Q]`` (float32); attribute ``mode=max|avg``; dims
``N, C, H, W`` and the window ``R`` (rows) x ``S`` (columns); integer parameters
``stride_h, stride_w`` (default 1), ``pad_t, pad_l, pad_b, pad_r`` (default 0, ONNX ``pads``
order), ``dil_h, dil_w`` (default 1), ``ceil_mode`` (0/1) and ``count_include_pad`` (0/1,
``mode=avg`` only). ``P``/``Q`` follow :func:`tunecache.compiler.ops.conv_window`: floor
division, or with ``ceil_mode`` rounding up and dropping a last window that would start past
the input (the ONNX rule). Padding never wins a max (it acts as -inf); an average divides by
the window's taps inside the input, or with ``count_include_pad`` inside the padded input
``[-pad, size + pad)`` (taps a ceil-mode window puts beyond the padding never count). Every
window must overlap the input. Epilogue: ``relu``.

The schedule family (knobs, legal space, default schedule) is in ``space.py``, the C kernels
in ``emit.py``.
"""

from __future__ import annotations

import numpy as np

from tunecache.compiler.elements import to_bfloat16
from tunecache.compiler.kinds import OpKind, narrow_tensors, register
from tunecache.compiler.kinds.layouts import (
    LAYOUTS,
    NCHW,
    TILE_ROW_LAYOUT,
    from_layout,
    random_tensor,
    tensor_shape,
    to_layout,
    with_attrs,
)
from tunecache.compiler.kinds.pool2d.emit import emit_pool2d
from tunecache.compiler.kinds.pool2d.narrow import (
    NARROW,
    bf16_variant,
    narrow_problems,
    narrow_type,
    with_narrow,
)
from tunecache.compiler.kinds.pool2d.space import (
    OW_VECTORS,
    ROWS_CHOICES,
    UNROLL_CHOICES,
    VEC_CHOICES,
    Pool2dSchedule,
    default_pool2d_schedule,
    is_blocked,
    is_global,
    pool2d_problems,
)
from tunecache.compiler.ops import KindSpec, OpSignature, TensorArg, conv_window, window_params

__all__ = ["MODES", "OW_VECTORS", "ROWS_CHOICES", "UNROLL_CHOICES", "VEC_CHOICES",
           "Pool2dSchedule", "axis_counts", "default_pool2d_schedule", "emit_pool2d",
           "global_pool2d_op", "is_blocked", "is_global", "pool2d_op",
           "pool2d_problems"]

MODES = ("max", "avg")


def pool2d_op(N: int, C: int, H: int, W: int, R: int, S: int, *, mode: str = "max",
              stride: int | tuple[int, int] = 1, pads: int | tuple[int, int, int, int] = 0,
              dilation: int | tuple[int, int] = 1, ceil_mode: bool = False,
              count_include_pad: bool = False, epilogue: tuple[str, ...] | str = (),
              dtype: str = "float32", layout: str = NCHW, narrow: str = "none") -> OpSignature:
    """``Y[N,C,P,Q] = pool(X[N,C,H,W])`` over ``R x S`` windows.

    ``stride`` and ``dilation`` are ``(h, w)`` or one int for both; ``pads`` is
    ``(top, left, bottom, right)`` (ONNX ``pads`` order) or one int for all four.
    ``layout`` (X's and Y's) is ``nchw`` or a channel-blocked ``nchw{x}c``; ``narrow``
    names the tensors a bf16 pool2d holds as bfloat16 (``x``, ``y``, ``x+y``), an int8 one
    as uint8 (``x+y``; :mod:`~tunecache.compiler.kinds.pool2d.narrow`).
    """
    steps = (() if epilogue in ("", "none") else tuple(epilogue.split("+"))) \
        if isinstance(epilogue, str) else tuple(epilogue)
    return OpSignature(
        KIND.name,
        (("N", N), ("C", C), ("H", H), ("W", W), ("R", R), ("S", S),
         *window_params(stride, pads, dilation), ("ceil_mode", int(ceil_mode)),
         ("count_include_pad", int(count_include_pad))),
        dtype, (("mode", mode), ("layout", layout), ("narrow", narrow)), steps,
    )


def global_pool2d_op(N: int, C: int, H: int, W: int, *, mode: str = "avg",
                     epilogue: tuple[str, ...] | str = (), layout: str = NCHW) -> OpSignature:
    """ONNX ``GlobalAveragePool`` / ``GlobalMaxPool``: one window covering each plane."""
    return pool2d_op(N, C, H, W, H, W, mode=mode, epilogue=epilogue, layout=layout)


def _axes(op: OpSignature) -> tuple[tuple[str, int, int, int, int, int, int, int], ...]:
    """Per spatial axis: (name, size, kernel, stride, pad_lo, pad_hi, dilation, outputs)."""
    d = dict(op.dims)  # also called while the signature is being validated
    out = []
    for axis, size, k, stride, lo, hi, dil in (
        ("height", d["H"], d["R"], d["stride_h"], d["pad_t"], d["pad_b"], d["dil_h"]),
        ("width", d["W"], d["S"], d["stride_w"], d["pad_l"], d["pad_r"], d["dil_w"]),
    ):
        outputs = conv_window(size, lo, hi, k, dil, stride, bool(d["ceil_mode"]))[1]
        out.append((axis, size, k, stride, lo, hi, dil, outputs))
    return tuple(out)


def _signature_problems(op: OpSignature) -> list[str]:
    d = dict(op.dims)
    found = narrow_problems(op)
    for flag in ("ceil_mode", "count_include_pad"):
        if d[flag] not in (0, 1):
            found.append(f"{flag}={d[flag]} must be 0 or 1")
    if op.attr("mode") == "max" and d["count_include_pad"]:
        found.append("count_include_pad applies to mode=avg only; use 0 with mode=max")
    if found:
        return found
    for axis, size, k, stride, lo, hi, dil, _ in _axes(op):
        extent, _ = conv_window(size, lo, hi, k, dil, stride)
        if extent > size + lo + hi:
            found.append(f"window {axis} {k} (dilated to {extent}) is larger than the padded "
                         f"input {axis} {size}+{lo}+{hi}={size + lo + hi}")
            continue
        empty = _padding_only_window(size, k, stride, lo, hi, dil, bool(d["ceil_mode"]))
        if empty is not None:
            found.append(f"output {empty} along the {axis} pools only padding "
                         f"(size {size}, window {k}, stride {stride}, dilation {dil}, pads "
                         f"{lo}/{hi}); every window must overlap the input")
    return found


def _padding_only_window(size: int, k: int, stride: int, lo: int, hi: int, dil: int,
                         ceil: bool) -> int | None:
    """The first output index whose window has no tap inside the input, or None.

    A window starting inside the input has its first tap there; only windows starting in
    the leading padding (at most ``lo/stride + 1`` of them) or past the input can be empty.
    """
    outputs = conv_window(size, lo, hi, k, dil, stride, ceil)[1]
    if (outputs - 1) * stride - lo >= size:
        return outputs - 1
    for o in range(min(outputs, lo // stride + 1)):
        start = o * stride - lo
        first = -(start // dil)  # start < 0: the first tap at or after position 0
        if first >= k or start + first * dil >= size:
            return o
    return None


def _arguments(op: OpSignature) -> tuple[TensorArg, ...]:
    d = op.dims_dict
    layout, held, narrow = op.attr("layout"), narrow_tensors(op), narrow_type(op)
    return (TensorArg("X", tensor_shape(d["N"], d["C"], d["H"], d["W"], layout), "input",
                      narrow if "x" in held else "float32"),
            TensorArg("Y", tensor_shape(d["N"], d["C"], op.out_h, op.out_w, layout), "output",
                      narrow if "y" in held else "float32"))


def _flops(op: OpSignature) -> int:
    d = op.dims_dict
    outputs = d["N"] * d["C"] * op.out_h * op.out_w
    return outputs * (d["R"] * d["S"] + len(op.epilogue))


def axis_counts(size: int, k: int, stride: int, lo: int, hi: int, dil: int, outputs: int,
                include_pad: bool) -> np.ndarray:
    """Taps of each output's window along one axis that an average divides by: inside the
    input, or with ``include_pad`` inside the padded input ``[-lo, size + hi)``."""
    pos = np.arange(outputs)[:, None] * stride - lo + np.arange(k)[None, :] * dil
    low, high = (-lo, size + hi) if include_pad else (0, size)
    return np.count_nonzero((pos >= low) & (pos < high), axis=1)


def _reference(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """Pooling in the inputs' dtype: a vertical then a horizontal reduction of strided slices
    of the padded input (R + S whole-array operations)."""
    d = op.dims_dict
    x = from_layout(inputs[0], op.attr("layout"), d["C"])
    avg = op.attr("mode") == "avg"
    (_, h, r, sh, pt, pb, dh, p), (_, w, s, sw, pl, pr, dw, q) = _axes(op)
    if is_global(op):
        y = x.mean(axis=(2, 3), keepdims=True) if avg else x.max(axis=(2, 3), keepdims=True)
    else:
        # Pad to cover every window, ceil-mode windows reaching past the padding included.
        need_h = max(h + pt + pb, (p - 1) * sh + dh * (r - 1) + 1)
        need_w = max(w + pl + pr, (q - 1) * sw + dw * (s - 1) + 1)
        fill = 0.0 if avg else -np.inf
        xp = np.pad(x, ((0, 0), (0, 0), (pt, need_h - h - pt), (pl, need_w - w - pl)),
                    constant_values=fill)
        reduce = np.add if avg else np.maximum
        v = xp[:, :, 0:(p - 1) * sh + 1:sh, :].copy()
        for i in range(1, r):
            reduce(v, xp[:, :, i * dh:i * dh + (p - 1) * sh + 1:sh, :], out=v)
        y = v[:, :, :, 0:(q - 1) * sw + 1:sw].copy()
        for j in range(1, s):
            reduce(y, v[:, :, :, j * dw:j * dw + (q - 1) * sw + 1:sw], out=y)
        if avg:
            include = bool(d["count_include_pad"])
            ch = axis_counts(h, r, sh, pt, pb, dh, p, include)
            cw = axis_counts(w, s, sw, pl, pr, dw, q, include)
            y /= (ch[:, None] * cw[None, :]).astype(x.dtype)
    if "relu" in op.epilogue:
        y = np.maximum(y, 0)
    return to_layout(np.ascontiguousarray(y, dtype=x.dtype), op.attr("layout"))


def _random_inputs(op: OpSignature, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Standard normal X, as for every kind; a blocked X gets zero padding lanes."""
    d = op.dims_dict
    x = random_tensor(rng, d["N"], d["C"], d["H"], d["W"], op.attr("layout"))
    if "x" not in narrow_tensors(op):
        return (x,)
    if narrow_type(op) == "uint8":  # bytes over their whole range; padding lanes stay zero
        return (np.where(x != 0, np.clip(x * 64 + 128, 0, 255), 0).astype(np.uint8),)
    return (to_bfloat16(x),)


def _tolerance(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> tuple[float, float]:
    # A max is exact. An average of n terms summed in float32 in any order errs by at most
    # about n*eps times the mean magnitude of its terms (eps = 6e-8): bounded here with the
    # input's mean magnitude, tight enough that a lost row or column of a window shows.
    terms = op.dim("R") * op.dim("S") if op.attr("mode") == "avg" else 0
    return 1e-5, 1e-7 * terms * float(np.abs(inputs[0]).mean()) + 1e-6


def _relayout(op: OpSignature, src: str, dst: str) -> OpSignature | None:
    """A window stays in its layout: X and Y share one."""
    return with_attrs(op, layout=src) if src == dst else None


KIND = register(OpKind(
    name="pool2d",
    spec=KindSpec(
        dims=("N", "C", "H", "W", "R", "S"),
        attrs={"mode": MODES, "layout": (*LAYOUTS, TILE_ROW_LAYOUT), "narrow": NARROW},
        epilogues=("relu",),
        params={
            "stride_h": (1, 1), "stride_w": (1, 1),
            "pad_t": (0, 0), "pad_l": (0, 0), "pad_b": (0, 0), "pad_r": (0, 0),
            "dil_h": (1, 1), "dil_w": (1, 1), "ceil_mode": (0, 0), "count_include_pad": (0, 0),
        },
        check=_signature_problems,
        dtypes=("float32", "bf16", "int8"),
        omit_default=frozenset({"layout", "narrow"}),
    ),
    arguments=_arguments,
    flops=_flops,
    schedule=Pool2dSchedule,
    problems=pool2d_problems,
    default_schedule=default_pool2d_schedule,
    emit=emit_pool2d,
    reference=_reference,
    reduction_length=lambda op: op.dim("R") * op.dim("S") if op.attr("mode") == "avg" else 1,
    dim_columns={
        "N": "dim_batch", "C": "dim_c", "H": "dim_h", "W": "dim_w", "R": "dim_r", "S": "dim_s",
        "stride_h": "stride_h", "stride_w": "stride_w", "pad_t": "pad_t", "pad_l": "pad_l",
        "pad_b": "pad_b", "pad_r": "pad_r", "dil_h": "dil_h", "dil_w": "dil_w",
        "ceil_mode": "ceil_mode", "count_include_pad": "count_include_pad",
    },
    baseline="numpy",
    tolerance=_tolerance,
    random_inputs=_random_inputs,
    layout_slots=lambda op: ("in",),
    relayout=_relayout,
    bf16_variant=bf16_variant,
    with_narrow=with_narrow,
    examples=(
        "pool2d(N=1,C=64,H=112,W=112,R=3,S=3,stride_h=2,stride_w=2,pad_t=1,pad_l=1,pad_b=1,"
        "pad_r=1,mode=max)",  # ResNet-50 stem
        "pool2d(N=1,C=2048,H=7,W=7,R=7,S=7,mode=avg)",  # ResNet-50 global average pool
        "pool2d(N=1,C=192,H=35,W=35,R=3,S=3,pad_t=1,pad_l=1,pad_b=1,pad_r=1,mode=avg)",  # Inception
        "pool2d(N=1,C=64,H=224,W=224,R=2,S=2,stride_h=2,stride_w=2,mode=max)",  # VGG
        "pool2d(N=1,C=96,H=54,W=54,R=3,S=3,stride_h=2,stride_w=2,ceil_mode=1,mode=max)",  # SqueezeNet
        # the ResNet-50 stem pool and global average pool on blocked activations
        "pool2d(N=1,C=64,H=112,W=112,R=3,S=3,stride_h=2,stride_w=2,pad_t=1,pad_l=1,pad_b=1,"
        "pad_r=1,mode=max,layout=nchw16c)",
        "pool2d(N=1,C=2048,H=7,W=7,R=7,S=7,mode=avg,layout=nchw16c)",
    ),
))
