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

Kernels (C, every ISA of :mod:`tunecache.compiler.codegen.isa`): each output row is made in
two vectorised passes over a small row buffer of its thread: a *vertical* pass reduces the
window's valid input rows column by column (contiguous loads, ``vec`` vectors per step) into
the buffer, whose edges hold the padding value; a *horizontal* pass reduces ``S`` taps of the
buffer for ``ow_block`` output columns at a time (unaligned loads for ``stride_w=1``, a
stride-2 de-interleaving load for 2, gathered lanes above), scales averages by the separable
reciprocal window sizes and stores the row (its last tile spills whole vectors into the next
row, rewritten later, except at the end of a thread's range). Rows go in blocks of ``rows``:
the vertical passes of a block before its horizontal passes, because loading a row buffer at
unaligned offsets right after storing it stalls on store forwarding (blocks of four rows ran
about twice as fast on 35x35 planes). The input is read once from memory (the vertical pass
re-reads the few rows windows share from cache) and the output written once. Global pooling
(``R=H, S=W``, no padding, no dilation) reduces each contiguous plane directly. Threads split
the ``N*C*P`` output rows (the planes, for global pooling).

Blocked layout (``layout=nchw{x}c``, X and Y ``[N][ceil(C/x)][H][W][x]``, see
:mod:`tunecache.compiler.kinds.layouts`): a pixel's ``x`` channels are ``x/lanes`` vectors and
the window reduces whole pixels, so no row buffer and no horizontal shuffles are needed.
Threads split the output rows; each row's columns whose windows lie inside the input run
without bounds checks (``vec`` output pixels per step, the window-width loop unrolled by
``unroll``), the border columns check each tap; averages divide by the window's counted
taps. Global pooling reduces a plane's pixels ``vec`` at a time. ``ow_block`` (one vector),
``rows=1`` and ``nt=0`` do not apply.

Schedule knobs (:class:`Pool2dSchedule`): ``vec`` (1, 2, 4: vectors per step of the
vertical pass and of the global reduction), ``unroll`` (1, 2, 4: unroll of the window loops),
``ow_block`` (output columns per register tile of the horizontal pass: 1, 2 or 4 vectors),
``rows`` (1, 2, 4: output rows per block), ``nt`` (0/1: output rows go through a per-thread
stage and leave it as whole cache lines by non-temporal stores, saving the read-for-ownership
traffic when Y misses the cache), ``threads``. Global pooling takes one-vector ``ow_block``,
``rows=1`` and ``nt=0`` (none applies). Channels are not blocked: an NCHW plane is contiguous
and independent of the others, so grouping them gives no reuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tunecache.compiler.codegen.abi import HEADER, TIMER, WORKSPACE, parallel_entry
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import OpKind, register
from tunecache.compiler.kinds.layouts import (
    LAYOUTS,
    NCHW,
    channel_block,
    from_layout,
    layout_problems,
    random_tensor,
    tensor_shape,
    to_layout,
    with_attrs,
)
from tunecache.compiler.mathutil import round_up
from tunecache.compiler.ops import KindSpec, OpSignature, TensorArg, conv_window, window_params
from tunecache.compiler.schedule import MAX_PACKED_BYTES, ScheduleData, threads_problem

__all__ = ["MODES", "Pool2dSchedule", "axis_counts", "global_pool2d_op", "is_blocked", "is_global",
           "pool2d_op"]

MODES = ("max", "avg")
VEC_CHOICES = (1, 2, 4)
UNROLL_CHOICES = (1, 2, 4)
OW_VECTORS = (1, 2, 4)
ROWS_CHOICES = (1, 2, 4)
_ALIGN = 16  # floats: 64 bytes


@dataclass(frozen=True, slots=True)
class Pool2dSchedule(ScheduleData):
    """Knobs of a pool2d kernel (see the module docstring)."""

    family: ClassVar[str] = "pool2d"

    ow_block: int
    vec: int = 1
    unroll: int = 1
    rows: int = 1
    nt: int = 0
    threads: int = 1

    def __str__(self) -> str:
        return (f"ow{self.ow_block} v{self.vec} u{self.unroll} r{self.rows} nt{self.nt} "
                f"t{self.threads}")


def pool2d_op(N: int, C: int, H: int, W: int, R: int, S: int, *, mode: str = "max",
              stride: int | tuple[int, int] = 1, pads: int | tuple[int, int, int, int] = 0,
              dilation: int | tuple[int, int] = 1, ceil_mode: bool = False,
              count_include_pad: bool = False, epilogue: tuple[str, ...] | str = (),
              dtype: str = "float32", layout: str = NCHW) -> OpSignature:
    """``Y[N,C,P,Q] = pool(X[N,C,H,W])`` over ``R x S`` windows.

    ``stride`` and ``dilation`` are ``(h, w)`` or one int for both; ``pads`` is
    ``(top, left, bottom, right)`` (ONNX ``pads`` order) or one int for all four.
    ``layout`` (X's and Y's) is ``nchw`` or a channel-blocked ``nchw{x}c``.
    """
    steps = (() if epilogue in ("", "none") else tuple(epilogue.split("+"))) \
        if isinstance(epilogue, str) else tuple(epilogue)
    return OpSignature(
        KIND.name,
        (("N", N), ("C", C), ("H", H), ("W", W), ("R", R), ("S", S),
         *window_params(stride, pads, dilation), ("ceil_mode", int(ceil_mode)),
         ("count_include_pad", int(count_include_pad))),
        dtype, (("mode", mode), ("layout", layout)), steps,
    )


def global_pool2d_op(N: int, C: int, H: int, W: int, *, mode: str = "avg",
                     epilogue: tuple[str, ...] | str = (), layout: str = NCHW) -> OpSignature:
    """ONNX ``GlobalAveragePool`` / ``GlobalMaxPool``: one window covering each plane."""
    return pool2d_op(N, C, H, W, H, W, mode=mode, epilogue=epilogue, layout=layout)


def is_blocked(op: OpSignature) -> bool:
    """X and Y are channel-blocked (``nchw{x}c``)."""
    return bool(channel_block(op.attr("layout")))


def is_global(op: OpSignature) -> bool:
    """The window is the whole plane: no padding, no dilation (so ``P = Q = 1``)."""
    d = op.dims_dict
    return (d["R"] == d["H"] and d["S"] == d["W"] and d["dil_h"] == 1 and d["dil_w"] == 1
            and not any(d[k] for k in ("pad_t", "pad_l", "pad_b", "pad_r")))


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
    found = []
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
    layout = op.attr("layout")
    return (TensorArg("X", tensor_shape(d["N"], d["C"], d["H"], d["W"], layout), "input"),
            TensorArg("Y", tensor_shape(d["N"], d["C"], op.out_h, op.out_w, layout), "output"))


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
    return (random_tensor(rng, d["N"], d["C"], d["H"], d["W"], op.attr("layout")),)


def _tolerance(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> tuple[float, float]:
    # A max is exact. An average of n terms summed in float32 in any order errs by at most
    # about n*eps times the mean magnitude of its terms (eps = 6e-8): bounded here with the
    # input's mean magnitude, tight enough that a lost row or column of a window shows.
    terms = op.dim("R") * op.dim("S") if op.attr("mode") == "avg" else 0
    return 1e-5, 1e-7 * terms * float(np.abs(inputs[0]).mean()) + 1e-6


# -- schedules ------------------------------------------------------------------------------


def _row_buffer(op: OpSignature, s: Pool2dSchedule, lanes: int) -> tuple[int, int, int]:
    """(offset of input column 0, floats, output columns rounded to tiles) of the row buffer
    of the horizontal pass: padding value around the ``W`` columns, with room for the widest
    load of the last tile."""
    d = op.dims_dict
    origin = round_up(d["pad_l"], _ALIGN)
    tiles = round_up(op.out_w, s.ow_block)
    reach = origin - d["pad_l"] + (tiles - lanes) * d["stride_w"] + (d["S"] - 1) * d["dil_w"] \
        + lanes * d["stride_w"]
    return origin, round_up(max(reach, origin + round_up(d["W"], lanes)), _ALIGN), tiles


def _stage_floats(op: OpSignature, s: Pool2dSchedule, lanes: int) -> int:
    """Floats of the staging buffer of ``nt`` (output rows on their way to streaming
    stores): a partial cache line, a block of rows and its last tile's spill, and slack for
    moving a partial line."""
    return round_up(s.rows * op.out_w + s.ow_block + 2 * _ALIGN, _ALIGN) if s.nt else 0


def _workspace_floats(op: OpSignature, s: Pool2dSchedule, lanes: int) -> int:
    """Floats of one thread's workspace: ``rows`` row buffers, the column reciprocals,
    then the staging buffer."""
    if is_global(op):
        return 0
    _, floats, tiles = _row_buffer(op, s, lanes)
    return s.rows * floats + round_up(tiles, _ALIGN) + _stage_floats(op, s, lanes)


def pool2d_problems(op: OpSignature, s: Pool2dSchedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``s`` is illegal for the pool2d ``op`` on ``hw`` (empty when legal)."""
    found: list[str] = []
    lanes = hw.lanes
    if is_blocked(op):
        return _blocked_problems(op, s, hw)
    if s.vec not in VEC_CHOICES:
        found.append(f"vec={s.vec}; expected one of {', '.join(map(str, VEC_CHOICES))}")
    if s.unroll not in UNROLL_CHOICES:
        found.append(f"unroll={s.unroll}; expected one of {', '.join(map(str, UNROLL_CHOICES))}")
    widths = [v * lanes for v in OW_VECTORS]
    if is_global(op):
        if s.ow_block != lanes:
            found.append(f"ow_block does not apply to global pooling (the window is the whole "
                         f"plane); use {lanes} (one {hw.isa} vector)")
    elif s.ow_block not in widths:
        found.append(f"ow_block={s.ow_block} must be 1, 2 or 4 vectors of {lanes} lanes "
                     f"({', '.join(map(str, widths))} on {hw.isa})")
    if s.rows not in ROWS_CHOICES:
        found.append(f"rows={s.rows}; expected one of {', '.join(map(str, ROWS_CHOICES))}")
    elif s.rows != 1 and is_global(op):
        found.append("rows does not apply to global pooling (one output per plane); use 1")
    if s.nt not in (0, 1):
        found.append(f"nt={s.nt} must be 0 or 1")
    elif s.nt and is_global(op):
        found.append("nt does not apply to global pooling (one float per plane); use 0")
    found += threads_problem(s.threads, hw)
    if not found:
        floats = s.threads * _workspace_floats(op, s, lanes)
        if 4 * floats > MAX_PACKED_BYTES:
            found.append(f"row buffers would take {4 * floats >> 20} MiB "
                         f"(> {MAX_PACKED_BYTES >> 20} MiB)")
    return found


def _blocked_problems(op: OpSignature, s: Pool2dSchedule, hw: HardwareSpec) -> list[str]:
    """Legality for a blocked layout: pixels per step, window unroll, threads; the row-buffer
    knobs at their neutral values."""
    found = layout_problems((op.attr("layout"),), hw)
    what = f"layout={op.attr('layout')} (whole pixels are vectors)"
    if s.vec not in VEC_CHOICES:
        found.append(f"vec={s.vec}; expected one of {', '.join(map(str, VEC_CHOICES))}")
    if s.unroll not in UNROLL_CHOICES:
        found.append(f"unroll={s.unroll}; expected one of {', '.join(map(str, UNROLL_CHOICES))}")
    if s.ow_block != hw.lanes:
        found.append(f"ow_block does not apply to {what}; use {hw.lanes} (one {hw.isa} vector)")
    if s.rows != 1:
        found.append(f"rows does not apply to {what}; use 1")
    if s.nt != 0:
        found.append(f"nt does not apply to {what}; use 0")
    return found + threads_problem(s.threads, hw)


def default_pool2d_schedule(op: OpSignature, hw: HardwareSpec, threads: int = 1) -> Pool2dSchedule:
    """Two vectors per step (four for global pooling of large planes), the output tile that
    wastes the fewest columns on the row's last tile (the wider on a tie), blocks of four
    rows, the window loops not unrolled, plain stores (streaming ones measured no faster
    here: the staging they need costs what the saved traffic gains)."""
    lanes = hw.lanes
    if is_blocked(op):
        return Pool2dSchedule(ow_block=lanes, vec=2, threads=threads)
    if is_global(op):
        plane = op.dim("H") * op.dim("W")
        vec = 4 if plane >= 8 * lanes else 2 if plane >= 2 * lanes else 1
        return Pool2dSchedule(ow_block=lanes, vec=vec, threads=threads)
    q = op.out_w
    nv = min(OW_VECTORS, key=lambda v: (round_up(q, v * lanes), -v))
    vec = 2 if op.dim("W") >= 2 * lanes else 1
    return Pool2dSchedule(ow_block=nv * lanes, vec=vec, rows=4, threads=threads)


# -- C emitter ------------------------------------------------------------------------------


def _constants(op: OpSignature, lanes: int) -> str:
    d = op.dims_dict
    values = {
        "NPLANES": d["N"] * d["C"], "IH": d["H"], "IW": d["W"], "OH": op.out_h, "OW": op.out_w,
        "KH": d["R"], "KW": d["S"], "SH": d["stride_h"], "SW": d["stride_w"],
        "PT": d["pad_t"], "PB": d["pad_b"], "PL": d["pad_l"], "PR": d["pad_r"],
        "DH": d["dil_h"], "DW": d["dil_w"], "LANES": lanes,
    }
    return "".join(f"#define {k} {v}L\n" for k, v in values.items())


def _reduce_op(op: OpSignature) -> str:
    return "VADD" if op.attr("mode") == "avg" else "VMAX"


def _finish(op: OpSignature, v: str) -> list[str]:
    return [f"{v} = VRELU({v});"] if "relu" in op.epilogue else []


def _emit_global(op: OpSignature, s: Pool2dSchedule, d: IsaDialect) -> str:
    """Each plane of ``IH*IW`` contiguous floats reduced to one output."""
    red = _reduce_op(op)
    avg = op.attr("mode") == "avg"
    nv = s.vec
    fill = "0.0f" if avg else "-__builtin_inff()"
    accs = [f"a{v}" for v in range(nv)]
    init = " ".join(f"vec a{v} = VSET1({fill});" for v in range(nv))
    step = "\n".join(f"      a{v} = {red}(a{v}, VLOADU(x + i + {v} * LANES));" for v in range(nv))
    combine = "".join(f"  a0 = {red}(a0, {a});\n" for a in accs[1:])
    scalar = "VHSUM(a0) * (1.0f / (float)PLANE)" if avg else "VHMAX(a0)"
    relu = " if (r < 0.0f) r = 0.0f;" if "relu" in op.epilogue else ""
    body = f"""\
#define PLANE (IH * IW)
static inline float reduce_plane(const float *x) {{
  {init}
  long i = 0;
  #pragma GCC unroll {s.unroll}
  for (; i + {nv} * LANES <= PLANE; i += {nv} * LANES) {{
{step}
  }}
  for (; i + LANES <= PLANE; i += LANES) a0 = {red}(a0, VLOADU(x + i));
  if (i < PLANE) a0 = {red}(a0, VFILL_PART(VLOADU_PART(x + i, (int)(PLANE - i)), (int)(PLANE - i), {fill}));
{combine}  return {scalar};
}}

static void pool_part(const float *X, float *Y, int tid, int nth) {{
  long lo, hi;
  split_range(NPLANES, tid, nth, &lo, &hi);
  for (long c = lo; c < hi; c++) {{
    float r = reduce_plane(X + c * PLANE);{relu}
    Y[c] = r;
  }}
}}
"""
    return body


def _load(stride_w: int) -> str:
    if stride_w == 1:
        return "VLOADU"
    if stride_w == 2:
        return "VLOADS2"
    return "load_strided"


_STRIDED_LOAD = """\
static inline vec load_strided(const float *p) {
  float t[LANES];
  for (int i = 0; i < LANES; i++) t[i] = p[i * SW];
  return VLOADU(t);
}
"""

# nt: output rows go through a per-thread stage that lines up with the cache lines of Y;
# whole lines leave it by streaming stores, back to back (a line half written by streaming
# stores and finished much later costs a partial-line write to memory), the first partial
# line of a thread's range and its last by plain stores.
_STAGE = """\
#define LINE 16L
static inline void stage_flush(float *Y, float *stage, long *base, long *fill, long *skip) {
  const long lines = *fill / LINE;
  for (long v = 0; v < lines; v++) {
    if (v == 0 && *skip) {
      for (long l = *skip; l < LINE; l++) Y[*base + l] = stage[l];
      *skip = 0;
      continue;
    }
    for (long l = 0; l < LINE; l += LANES)
      VSTREAM(Y + *base + v * LINE + l, VLOAD(stage + v * LINE + l));
  }
  if (lines) {
    for (long l = 0; l < LINE; l += LANES) VSTOREU(stage + l, VLOADU(stage + lines * LINE + l));
    *base += lines * LINE;
    *fill -= lines * LINE;
  }
}
"""

_COUNT = """\
/* Taps of output o's window along one axis that an average divides by. */
static float window_taps(long o, long size, long k, long stride, long lo, long hi, long dil) {
  long n = 0;
  for (long t = 0; t < k; t++) {
    long pos = o * stride - lo + t * dil;
    n += INCLUDE_PAD ? (pos >= -lo && pos < size + hi) : (pos >= 0 && pos < size);
  }
  return (float)n;
}
"""


def _emit_vertical(op: OpSignature, s: Pool2dSchedule) -> str:
    """Reduce the ``nr`` valid window rows column by column into ``out[0..IW)``."""
    red = _reduce_op(op)
    nv = s.vec
    first = " ".join(f"vec a{v} = VLOADU(rows[0] + j + {v} * LANES);" for v in range(nv))
    more = "\n".join(f"        a{v} = {red}(a{v}, VLOADU(rows[k] + j + {v} * LANES));"
                     for v in range(nv))
    store = " ".join(f"VSTOREU(out + j + {v} * LANES, a{v});" for v in range(nv))
    return f"""\
static inline void vertical(const float *const *rows, int nr, float *out) {{
  long j = 0;
  for (; j + {nv} * LANES <= IW; j += {nv} * LANES) {{
    {first}
    #pragma GCC unroll {s.unroll}
    for (int k = 1; k < nr; k++) {{
{more}
    }}
    {store}
  }}
  for (; j + LANES <= IW; j += LANES) {{
    vec a = VLOADU(rows[0] + j);
    for (int k = 1; k < nr; k++) a = {red}(a, VLOADU(rows[k] + j));
    VSTOREU(out + j, a);
  }}
  if (j < IW) {{
    const int n = (int)(IW - j);
    vec a = VLOADU_PART(rows[0] + j, n);
    for (int k = 1; k < nr; k++) a = {red}(a, VLOADU_PART(rows[k] + j, n));
    VSTOREU(out + j, VFILL_PART(a, n, PAD_VALUE)); /* the buffer has room; padding stays */
  }}
}}
"""


def _emit_horizontal(op: OpSignature, s: Pool2dSchedule, lanes: int) -> str:
    """``KW`` taps of the row buffer for ``ow_block`` output columns at a time."""
    red = _reduce_op(op)
    avg = op.attr("mode") == "avg"
    nv = s.ow_block // lanes
    load = _load(op.dim("stride_w"))
    tile = ["const float *b = base + q0 * SW;"]
    tile += [f"vec a{v} = {load}(b + {v * lanes} * SW);" for v in range(nv)]
    tile += [f"#pragma GCC unroll {s.unroll}", "for (long t = 1; t < KW; t++) {",
             "  const float *c = b + t * DW;"]
    tile += [f"  a{v} = {red}(a{v}, {load}(c + {v * lanes} * SW));" for v in range(nv)]
    tile.append("}")
    for v in range(nv):
        if avg:
            tile.append(f"a{v} = VMUL(VMUL(a{v}, row_scale), VLOADU(inv_w + q0 + {v * lanes}));")
        tile += _finish(op, f"a{v}")
    full = [f"VSTOREU(y + q0 + {v * lanes}, a{v});" for v in range(nv)]
    part = [f"if (n > {v * lanes}) VSTOREU_PART(y + q0 + {v * lanes}, a{v}, "
            f"n - {v * lanes} < LANES ? (int)(n - {v * lanes}) : (int)LANES);" for v in range(nv)]
    body = "\n".join("    " + line for line in tile)
    return f"""\
/* spill: the last tile may write whole vectors past the row (rows written later, or stage
   slack, take them); else partial stores end it exactly. */
static inline void horizontal(const float *base, float *y, int spill, const float *inv_w,
                              vec row_scale) {{
  (void)inv_w; (void)row_scale;
  long q0 = 0;
  for (; q0 + {s.ow_block} <= OW; q0 += {s.ow_block}) {{
{body}
    {" ".join(full)}
  }}
  if (q0 < OW) {{
    const long n = OW - q0;
{body}
    if (spill) {{ {" ".join(full)} }}
    else {{ {" ".join(part)} }}
  }}
}}
"""


def _emit_windowed(op: OpSignature, s: Pool2dSchedule, d: IsaDialect) -> str:
    avg = op.attr("mode") == "avg"
    origin, floats, tiles = _row_buffer(op, s, d.lanes)
    fill = "0.0f" if avg else "-__builtin_inff()"
    parts = [
        f"#define INCLUDE_PAD {op.dim('count_include_pad')}\n#define PAD_VALUE {fill}\n"
        f"#define VB_ORIGIN {origin}L\n#define VB_FLOATS {floats}L\n#define QTILES {tiles}L\n"
        f"#define ROWS {s.rows}L\n#define WS_THREAD {_workspace_floats(op, s, d.lanes)}L\n",
        _COUNT,
    ]
    if op.dim("stride_w") > 2:
        parts.append(_STRIDED_LOAD)
    parts += [_emit_vertical(op, s), _emit_horizontal(op, s, d.lanes)]
    scale = ("VSET1(1.0f / window_taps(p, IH, KH, SH, PT, PB, DH))" if avg else "VZERO()")
    inv_w = ("  for (long q = 0; q < QTILES; q++)\n"
             "    inv_w[q] = q < OW ? 1.0f / window_taps(q, IW, KW, SW, PL, PR, DW) : 0.0f;\n"
             if avg else "")
    if s.nt:
        parts.append(_STAGE)
        setup = (f"  float *stage = inv_w + {round_up(tiles, _ALIGN)}L;\n"
                 "  const long mis = (long)(((unsigned long)Y / 4) & (LINE - 1));\n"
                 "  long base = ((lo * OW + mis) & ~(LINE - 1)) - mis, fill = lo * OW - base;\n"
                 "  long skip = fill;\n")
        # Lines written by the previous block leave before this block's rows are appended.
        flush = "    stage_flush(Y, stage, &base, &fill, &skip);\n"
        target = "stage + fill, 1"
        after = "      fill += OW;\n"
        finish = ("  stage_flush(Y, stage, &base, &fill, &skip);\n"
                  "  for (long l = skip; l < fill; l++) Y[base + l] = stage[l];\n"
                  "  VSFENCE();\n")
    else:
        # Rows are written in order, so a tile spilling into this thread's later rows is
        # overwritten in time.
        setup, flush, after, finish = "", "", "", ""
        target = f"Y + item * OW, (item + 1) * OW + {s.ow_block} <= hi * OW"
    parts.append(f"""\
/* The valid input rows of output row p's windows. */
static inline int window_rows(const float *x, long p, const float **rows) {{
  int nr = 0;
  for (long r = 0; r < KH; r++) {{
    const long h = p * SH - PT + r * DH;
    if (h >= 0 && h < IH) rows[nr++] = x + h * IW;
  }}
  return nr;
}}

/* ROWS output rows per block: their vertical passes first, so the row buffers' stores have
   left the store buffer when the horizontal passes load them at unaligned offsets. */
static void pool_part(const float *X, float *Y, float *ws, int tid, int nth) {{
  long lo, hi;
  split_range(NPLANES * OH, tid, nth, &lo, &hi);
  if (lo >= hi) return;
  float *vb = ws + tid * WS_THREAD, *inv_w = vb + ROWS * VB_FLOATS;
  for (long i = 0; i < ROWS * VB_FLOATS; i++) vb[i] = PAD_VALUE;
{inv_w}{setup}  for (long block = lo; block < hi; block += ROWS) {{
    const long n = MIN(ROWS, hi - block);
    for (long k = 0; k < n; k++) {{
      const long item = block + k, plane = item / OH, p = item % OH;
      const float *rows[KH];
      const int nr = window_rows(X + plane * (IH * IW), p, rows);
      vertical(rows, nr, vb + k * VB_FLOATS + VB_ORIGIN);
    }}
{flush}    for (long k = 0; k < n; k++) {{
      const long item = block + k, p = item % OH;
      (void)p;
      horizontal(vb + k * VB_FLOATS + VB_ORIGIN - PL, {target}, inv_w, {scale});
{after}    }}
  }}
{finish}}}
""")
    return "\n".join(parts)


# -- blocked layout -------------------------------------------------------------------------


def _interior_columns(op: OpSignature) -> tuple[int, int]:
    """Output columns ``[first, end)`` whose windows lie inside the input's width."""
    d = op.dims_dict
    q = op.out_w
    first = min(q, -(-d["pad_l"] // d["stride_w"]))
    last_start = d["W"] - 1 - (d["S"] - 1) * d["dil_w"] + d["pad_l"]
    end = last_start // d["stride_w"] + 1 if last_start >= 0 else 0
    return first, max(first, min(end, q))


def _pixel_accumulators(op: OpSignature, pixels: int, nvb: int) -> list[str]:
    fill = "VZERO()" if op.attr("mode") == "avg" else "VSET1(-__builtin_inff())"
    return [f"  vec {', '.join(f'a{v}_{k} = {fill}' for k in range(nvb))};"
            for v in range(pixels)]


def _pixel_stores(op: OpSignature, pixels: int, nvb: int, scale: str) -> list[str]:
    """Store ``pixels`` consecutive output pixels at ``y + q * XB``; ``scale`` (a float
    expression of ``v``, the pixel) multiplies averages."""
    avg = op.attr("mode") == "avg"
    lines = []
    for v in range(pixels):
        if avg:
            lines.append(f"  {{ const vec sc = VSET1({scale.format(v=v)});")
        for k in range(nvb):
            steps = ["vec t = " + (f"VMUL(a{v}_{k}, sc);" if avg else f"a{v}_{k};")]
            steps += _finish(op, "t")
            lines.append(f"    {{ {' '.join(steps)} VSTOREU(y + (q + {v}) * XB + {k} * LANES, t); }}")
        if avg:
            lines.append("  }")
    return lines


def _emit_blocked_windowed(op: OpSignature, s: Pool2dSchedule, nvb: int) -> str:
    red = _reduce_op(op)
    avg = op.attr("mode") == "avg"
    first, end = _interior_columns(op)
    parts = [f"#define Q0 {first}L\n#define Q1 {end}L\n"]
    if avg:
        parts.append(_COUNT)
    border = [
        "/* Output pixel q of the row at input row h0: taps inside the input only. */",
        "static inline void border_pixel(const float *x, float *y, long h0, long q, "
        "float scale) {",
        "  (void)scale;",
        *_pixel_accumulators(op, 1, nvb),
        "  for (long r = 0; r < KH; r++) {",
        "    const long h = h0 + r * DH;",
        "    if (h < 0 || h >= IH) continue;",
        "    for (long s = 0; s < KW; s++) {",
        "      const long w = q * SW - PL + s * DW;",
        "      if (w < 0 || w >= IW) continue;",
        "      const float *xp = x + (h * IW + w) * XB;",
        *(f"      a0_{k} = {red}(a0_{k}, VLOADU(xp + {k} * LANES));" for k in range(nvb)),
        "    }",
        "  }",
        *_pixel_stores(op, 1, nvb, "scale"),
        "}",
    ]
    parts.append("\n".join(border))
    for pixels in dict.fromkeys((s.vec, 1)):
        taps = [f"      a{v}_{k} = {red}(a{v}_{k}, VLOADU(xs + {v * op.dim('stride_w')} * XB "
                f"+ {k} * LANES));" for v in range(pixels) for k in range(nvb)]
        parts.append("\n".join([
            f"/* Output pixels q..q+{pixels - 1} of the row at input row h0, their windows "
            "inside the input's width. */",
            f"static inline void interior_{pixels}(const float *x, float *y, long h0, long q, "
            "const float *inv_w, float rscale) {",
            "  (void)inv_w; (void)rscale;",
            *_pixel_accumulators(op, pixels, nvb),
            "  const float *xq = x + (q * SW - PL) * XB;",
            "  for (long r = 0; r < KH; r++) {",
            "    const long h = h0 + r * DH;",
            "    if (h < 0 || h >= IH) continue;",
            "    const float *xr = xq + h * IW * XB;",
            f"    #pragma GCC unroll {s.unroll}",
            "    for (long s = 0; s < KW; s++) {",
            "      const float *xs = xr + s * DW * XB;",
            *taps,
            "    }",
            "  }",
            *_pixel_stores(op, pixels, nvb, "rscale * inv_w[q + {v}]"),
            "}",
        ]))
    setup = ("  float *inv_w = ws + tid * WS_THREAD;\n"
             "  for (long q = 0; q < OW; q++) inv_w[q] = 1.0f / window_taps(q, IW, KW, SW, PL, "
             "PR, DW);\n" if avg else "  const float *inv_w = NULL;\n  (void)ws;\n")
    rscale = "1.0f / window_taps(p, IH, KH, SH, PT, PB, DH)" if avg else "1.0f"
    col = "rscale * inv_w[q]" if avg else "1.0f"
    parts.append(f"""\
static void pool_part(const float *X, float *Y, float *ws, int tid, int nth) {{
  long lo, hi;
  split_range(NBLK * OH, tid, nth, &lo, &hi);
  if (lo >= hi) return;
{setup}  for (long item = lo; item < hi; item++) {{
    const long p = item % OH;
    const float *x = X + item / OH * (IH * IW * XB);
    float *y = Y + item * (OW * XB);
    const long h0 = p * SH - PT;
    const float rscale = {rscale};
    (void)rscale;
    long q = 0;
    for (; q < Q0; q++) border_pixel(x, y, h0, q, {col});
    for (; q + {s.vec} <= Q1; q += {s.vec}) interior_{s.vec}(x, y, h0, q, inv_w, rscale);
    for (; q < Q1; q++) interior_1(x, y, h0, q, inv_w, rscale);
    for (; q < OW; q++) border_pixel(x, y, h0, q, {col});
  }}
}}
""")
    return "\n".join(parts)


def _emit_blocked_global(op: OpSignature, s: Pool2dSchedule, nvb: int) -> str:
    red = _reduce_op(op)
    nv = s.vec
    taps = "\n".join(f"      a{v}_{k} = {red}(a{v}_{k}, VLOADU(x + (i + {v}) * XB + {k} * LANES));"
                     for v in range(nv) for k in range(nvb))
    rest = "\n".join(f"      a0_{k} = {red}(a0_{k}, VLOADU(x + i * XB + {k} * LANES));"
                     for k in range(nvb))
    combine = "\n".join(f"    a0_{k} = {red}(a0_{k}, a{v}_{k});"
                        for v in range(1, nv) for k in range(nvb))
    stores = "\n".join(_pixel_stores(op, 1, nvb, "1.0f / (float)(IH * IW)"))
    return f"""\
static void pool_part(const float *X, float *Y, float *ws, int tid, int nth) {{
  (void)ws;
  long lo, hi;
  split_range(NBLK, tid, nth, &lo, &hi);
  for (long b = lo; b < hi; b++) {{
    const float *x = X + b * (IH * IW * XB);
    float *y = Y + b * XB;
    const long q = 0;
{chr(10).join("  " + line for line in _pixel_accumulators(op, nv, nvb))}
    long i = 0;
    #pragma GCC unroll {s.unroll}
    for (; i + {nv} <= IH * IW; i += {nv}) {{
{taps}
    }}
    for (; i < IH * IW; i++) {{
{rest}
    }}
{combine}
{chr(10).join("  " + line for line in stores.splitlines())}
  }}
}}
"""


def _emit_blocked(op: OpSignature, s: Pool2dSchedule, d: IsaDialect) -> str:
    """Pooling of blocked tensors: each output pixel's ``x`` channels are ``x/lanes``
    vectors reduced over its window's pixels."""
    x = channel_block(op.attr("layout"))
    nvb = x // d.lanes
    avg = op.attr("mode") == "avg"
    ws = round_up(op.out_w, _ALIGN) if avg and not is_global(op) else 0
    head = (f"#define XB {x}L\n#define NBLK {op.dim('N') * -(-op.dim('C') // x)}L\n"
            f"#define INCLUDE_PAD {op.dim('count_include_pad')}\n#define WS_THREAD {ws}L\n")
    if is_global(op):
        return head + _emit_blocked_global(op, s, nvb)
    return head + _emit_blocked_windowed(op, s, nvb)


def emit_pool2d(op: OpSignature, s: Pool2dSchedule, d: IsaDialect) -> str:
    """The C translation unit for the pool2d ``op`` under ``s`` (validated by the caller)."""
    out = [d.prelude, HEADER, _constants(op, d.lanes), WORKSPACE]
    if is_blocked(op):
        out.append(_emit_blocked(op, s, d))
        call, ws = "pool_part(X, Y, ws, TID, NTH);", f"{s.threads} * WS_THREAD"
    elif is_global(op):
        out.append(_emit_global(op, s, d))
        call, ws = "pool_part(X, Y, TID, NTH);", "0"
    else:
        out.append(_emit_windowed(op, s, d))
        call, ws = "pool_part(X, Y, ws, TID, NTH);", f"{s.threads} * WS_THREAD"
    out.append("int tc_kernel(void **args) {\n"
               "  const float *X = (const float *)args[0];\n  float *Y = (float *)args[1];\n"
               + parallel_entry(s.threads, call, ws))
    out.append(TIMER)
    return "\n".join(out)


def _relayout(op: OpSignature, src: str, dst: str) -> OpSignature | None:
    """A window stays in its layout: X and Y share one."""
    return with_attrs(op, layout=src) if src == dst else None


KIND = register(OpKind(
    name="pool2d",
    spec=KindSpec(
        dims=("N", "C", "H", "W", "R", "S"),
        attrs={"mode": MODES, "layout": LAYOUTS},
        epilogues=("relu",),
        params={
            "stride_h": (1, 1), "stride_w": (1, 1),
            "pad_t": (0, 0), "pad_l": (0, 0), "pad_b": (0, 0), "pad_r": (0, 0),
            "dil_h": (1, 1), "dil_w": (1, 1), "ceil_mode": (0, 0), "count_include_pad": (0, 0),
        },
        check=_signature_problems,
        omit_default=frozenset({"layout"}),
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
