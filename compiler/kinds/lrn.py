"""The ``lrn`` kind: local response normalisation across channels (ONNX ``LRN``).

Signature: ``X[N,C,H,W] -> Y[N,C,H,W]`` (float32); dims ``N, C, H, W`` and the window
``size`` (channels summed, ``>= 1``); attribute ``layout`` (X's and Y's: ``nchw`` or a
channel-blocked ``nchw{x}c``, :mod:`tunecache.compiler.kinds.layouts`). No epilogue. With
``lo = floor((size-1)/2)`` and ``hi = ceil((size-1)/2)``, each output is

    ``Y[n,c,h,w] = X[n,c,h,w] / (bias + alpha/size * sum(X[n,k,h,w]**2))**beta``

over channels ``k`` from ``c - lo`` to ``c + hi`` clipped to ``[0, C)``, exactly ONNX's rule
(an even ``size`` reaches one channel further up than down; ``size > C`` is clipped on both
sides). ``alpha``, ``beta`` and ``bias`` are runtime floats, the 3-element input ``coef =
(alpha, beta, bias)`` in ONNX's attribute order: a float is never part of a signature, so
the cache key stays integer and one kernel serves every coefficient. Arguments: ``X``,
``coef``, ``Y``.

The power (per vector, after the window sum ``s`` and ``t = bias + alpha/size * s``): for
``beta = 0.75`` (AlexNet's and GoogLeNet's) ``x / (sqrt(t) * t**0.25)`` with two square
roots and a division, exact to a few ulp; any other ``beta`` takes ``x * exp(-beta * ln t)`` with the
ISA's ``VEXP`` and ``VLOG`` (:mod:`tunecache.compiler.codegen.isa`), which need ``t``
positive and normal (``bias > 0``, ONNX's default 1, makes it so). Both paths are compiled;
the kernel picks one per call by comparing ``beta`` with 0.75.

Kernels (C, every ISA of :mod:`tunecache.compiler.codegen.isa`):

* ``nchw``: a channel's plane is contiguous and its window is the neighbouring planes, so
  vectors run along pixels and the window sum is ``size`` multiply-adds of whole vectors of
  the planes ``c - lo .. c + hi`` (fewer at the clipped borders). A tile is ``pixels``
  pixels of every channel of one image: for each channel in turn, the tile's row of the
  window's planes is read (all but the newest still in L1 from the channel before) and the
  channel's row written. ``vec`` vectors of pixels per step. Threads split the
  ``N * ceil(H*W / pixels)`` tiles.
* ``nchw{x}c``: a pixel's channels are contiguous within a block but blocks lie ``H*W*x``
  floats apart, and a channel's window crosses block boundaries. Each tile stages the
  squares of its ``pixels`` pixels' channels as contiguous per-pixel lines in the thread's
  workspace (``lo`` zeros before channel 0, ``hi`` after the last block), so a window sum is
  ``size`` unaligned vector loads of the line at consecutive offsets, whatever block the
  channels are in; then the outputs, ``vec`` vectors of channels at a time. Staging a tile
  before any of its lines is read lets the stores leave the store buffer before the
  overlapping unaligned loads read them (``pixels=1`` stalls on store forwarding). The
  padding lanes of the last block (channels ``C ..``) hold zeros in X and the window sums
  treat them as zero squares, which is what clipping at ``C`` asks for; their outputs are
  written as zeros explicitly (a zero input over ``t = 0`` would give NaN). Threads split
  the ``N * ceil(H*W / pixels)`` tiles.

Schedule knobs (:class:`LrnSchedule`): ``pixels`` (per tile: 64, 256, 1024 or 4096 pixels
of each plane for ``nchw``; 1, 2, 4 or 8 staged pixels for a blocked layout), ``vec`` (1, 2,
4 independent vectors per step) and ``threads``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tunecache.compiler.codegen.abi import (
    ALIGN_FLOATS,
    HEADER,
    TIMER,
    WORKSPACE,
    defines,
    parallel_entry,
    unpack_args,
)
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
from tunecache.compiler.ops import KindSpec, OpSignature, TensorArg
from tunecache.compiler.schedule import MAX_PACKED_BYTES, ScheduleData, threads_problem

__all__ = ["BLOCKED_PIXELS", "FAST_BETA", "PLAIN_PIXELS", "VEC_CHOICES", "LrnSchedule",
           "is_blocked", "lrn_op", "window"]

VEC_CHOICES = (1, 2, 4)
PLAIN_PIXELS = (64, 256, 1024, 4096)
"""Pixels of each plane per tile of an ``nchw`` kernel (multiples of 4 AVX-512 vectors)."""
BLOCKED_PIXELS = (1, 2, 4, 8)
"""Pixels staged per tile of a blocked kernel."""
FAST_BETA = 0.75
"""The ``beta`` computed with square roots instead of ``exp(-beta * ln t)``."""


@dataclass(frozen=True, slots=True)
class LrnSchedule(ScheduleData):
    """Knobs of an lrn kernel (see the module docstring)."""

    family: ClassVar[str] = "lrn"

    pixels: int
    vec: int = 1
    threads: int = 1

    def __str__(self) -> str:
        return f"p{self.pixels} v{self.vec} t{self.threads}"


def lrn_op(N: int, C: int, H: int, W: int, size: int, *, layout: str = NCHW,
           dtype: str = "float32") -> OpSignature:
    """``Y = LRN(X[N,C,H,W])`` over windows of ``size`` channels, X and Y in ``layout``."""
    return OpSignature(KIND.name, (("N", N), ("C", C), ("H", H), ("W", W), ("size", size)),
                       dtype, (("layout", layout),), ())


def window(size: int) -> tuple[int, int]:
    """Channels a window reaches below and above its own: ``(lo, hi)``, ONNX's
    ``floor((size-1)/2)`` and ``ceil((size-1)/2)``."""
    lo = (size - 1) // 2
    return lo, size - 1 - lo


def is_blocked(op: OpSignature) -> bool:
    """X and Y are channel-blocked (``nchw{x}c``)."""
    return bool(channel_block(op.attr("layout")))


def _arguments(op: OpSignature) -> tuple[TensorArg, ...]:
    d = op.dims_dict
    shape = tensor_shape(d["N"], d["C"], d["H"], d["W"], op.attr("layout"))
    return (TensorArg("X", shape, "input"), TensorArg("coef", (3,), "input"),
            TensorArg("Y", shape, "output"))


def _flops(op: OpSignature) -> int:
    """Per element: a multiply-add per window channel, then the scaled sum plus bias, the
    power and the product (one each)."""
    d = op.dims_dict
    return d["N"] * d["C"] * d["H"] * d["W"] * (2 * d["size"] + 4)


def _denominator(op: OpSignature, x: np.ndarray, alpha: np.generic,
                 bias: np.generic) -> np.ndarray:
    """``bias + alpha/size * window sum of x**2`` for NCHW ``x``, in its dtype: ``size``
    whole-array adds over the zero-padded channel axis."""
    size = op.dim("size")
    lo, hi = window(size)
    channels = x.shape[1]
    padded = np.pad(x * x, ((0, 0), (lo, hi), (0, 0), (0, 0)))
    total = padded[:, :channels].copy()
    for k in range(1, size):
        total += padded[:, k:k + channels]
    return bias + alpha / x.dtype.type(size) * total


def _reference(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """The op in the inputs' dtype (also the executor's float32 fallback)."""
    layout = op.attr("layout")
    x = from_layout(inputs[0], layout, op.dim("C"))
    alpha, beta, bias = (x.dtype.type(v) for v in inputs[1][:3])
    y = x / _denominator(op, x, alpha, bias) ** beta
    return to_layout(np.ascontiguousarray(y, dtype=x.dtype), layout)


def _random_inputs(op: OpSignature, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Standard normal X (zero padding lanes when blocked); ``alpha/size = 0.5`` (so the
    window matters, unlike AlexNet's 1e-4 / 5), ``beta = 0.75``, ``bias = 1``."""
    d = op.dims_dict
    x = random_tensor(rng, d["N"], d["C"], d["H"], d["W"], op.attr("layout"))
    return x, np.array([0.5 * d["size"], FAST_BETA, 1.0], dtype=np.float32)


def _tolerance(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> tuple[float, float]:
    # Relative: the window sum of positive terms errs by about size ulps, t by two more; the
    # power multiplies t's error by beta, and exp(-beta * ln t) adds the error of ln t,
    # absolute, so growing with |ln t|.
    x = from_layout(inputs[0].astype(np.float64), op.attr("layout"), op.dim("C"))
    alpha, beta, bias = (float(v) for v in inputs[1][:3])
    with np.errstate(divide="ignore", invalid="ignore"):
        log_t = np.abs(np.log(_denominator(op, x, np.float64(alpha), np.float64(bias))))
    worst = float(log_t[np.isfinite(log_t)].max(initial=0.0))
    rtol = 1e-6 * (2.0 + abs(beta) * (op.dim("size") + 4.0 + worst))
    return rtol, 1e-12


# -- schedules ------------------------------------------------------------------------------


def _line(op: OpSignature) -> tuple[int, int]:
    """(offset of channel 0, floats) of a staged line of a blocked kernel: channel 0 on a
    64-byte boundary with ``lo`` zeros before it, ``hi`` zeros after the last block."""
    lo, hi = window(op.dim("size"))
    padded = -(-op.dim("C") // channel_block(op.attr("layout"))) \
        * channel_block(op.attr("layout"))
    origin = round_up(lo, ALIGN_FLOATS)
    return origin, round_up(origin + padded + hi, ALIGN_FLOATS)


def _workspace_floats(op: OpSignature, s: LrnSchedule) -> int:
    """Floats of one thread's workspace: the staged lines of a tile (none for ``nchw``)."""
    return s.pixels * _line(op)[1] if is_blocked(op) else 0


def lrn_problems(op: OpSignature, s: LrnSchedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``s`` is illegal for the lrn ``op`` on ``hw`` (empty when legal)."""
    layout = op.attr("layout")
    found = layout_problems((layout,), hw)
    if s.vec not in VEC_CHOICES:
        found.append(f"vec={s.vec}; expected one of {', '.join(map(str, VEC_CHOICES))}")
    if is_blocked(op):
        choices, what = BLOCKED_PIXELS, "pixels staged per tile"
    else:
        choices, what = PLAIN_PIXELS, "pixels of each plane per tile"
    if s.pixels not in choices:
        found.append(f"pixels={s.pixels}; expected one of {', '.join(map(str, choices))} for "
                     f"layout={layout} ({what})")
    found += threads_problem(s.threads, hw)
    if not found and 4 * s.threads * _workspace_floats(op, s) > MAX_PACKED_BYTES:
        found.append(f"staged lines would take {4 * s.threads * _workspace_floats(op, s) >> 20}"
                     f" MiB (> {MAX_PACKED_BYTES >> 20} MiB)")
    return found


def default_lrn_schedule(op: OpSignature, hw: HardwareSpec, threads: int = 1) -> LrnSchedule:
    """Two vectors per step; four staged pixels for a blocked layout; for ``nchw`` tiles of
    1024 pixels (the window's five rows fill 20 KiB of L1), smaller when the image has too
    few tiles for every thread."""
    if is_blocked(op):
        return LrnSchedule(pixels=4, vec=2, threads=threads)
    plane = op.dim("H") * op.dim("W")
    fitting = [p for p in PLAIN_PIXELS[:3] if op.dim("N") * -(-plane // p) >= threads]
    return LrnSchedule(pixels=max(fitting, default=PLAIN_PIXELS[0]), vec=2, threads=threads)


# -- C emitter ------------------------------------------------------------------------------

# x * t**-beta from the window sum s: va = alpha/size, vb = bias, nb = -beta.
_POWERS = """\
static inline vec pow_p75(vec x, vec s, vec va, vec vb, vec nb) {
  (void)nb;
  const vec t = VFMA(va, s, vb), q = VSQRT(t);
  return VDIV(x, VMUL(q, VSQRT(q)));
}
static inline vec pow_any(vec x, vec s, vec va, vec vb, vec nb) {
  const vec t = VFMA(va, s, vb);
  const vec f = VEXP(VMUL(nb, VLOG(t)));
  return VMUL(x, VSEL_LT(t, VSET1(__builtin_inff()), f, VDIV(VZERO(), t)));
}
"""
# An inf in the window makes t inf: x / t**beta is then 0 (x finite) or NaN (x itself
# inf), as the definition gives, where t**0.25 / t or ln t would make every one NaN. The
# same for a NaN t, which stays NaN (0 / NaN); beta is positive in every model met.

_POWER_NAMES = ("p75", "any")


def _plain(op: OpSignature, s: LrnSchedule) -> str:
    """Kernels on NCHW planes: vectors of pixels, the window's planes summed."""
    nv = s.vec

    def step(width: int, load: str, store: str) -> list[str]:
        """Sums and outputs for ``width`` vectors at pixel ``p``."""
        lines = ["vec " + ", ".join(f"s{v} = VZERO()" for v in range(width)) + ";",
                 "for (long k = 0; k < taps; k++) {",
                 "  const float *r = w + k * HW + p;"]
        lines += [f"  {{ const vec v = {load.format(f'r + {v} * LANES')}; "
                  f"s{v} = VFMA(v, v, s{v}); }}" for v in range(width)]
        lines.append("}")
        lines += [store.format(f"y + p + {v} * LANES",
                               f"POW({load.format(f'x + p + {v} * LANES')}, s{v}, va, vb, nb)")
                  for v in range(width)]
        return lines

    body = [
        f"for (; p + {nv} * LANES <= p1; p += {nv} * LANES) {{",
        *("  " + line for line in step(nv, "VLOADU({})", "VSTOREU({}, {});")),
        "}",
        "for (; p + LANES <= p1; p += LANES) {",
        *("  " + line for line in step(1, "VLOADU({})", "VSTOREU({}, {});")),
        "}",
        "if (p < p1) {",
        "  const int n = (int)(p1 - p);",
        *("  " + line for line in step(1, "VLOADU_PART({}, n)", "VSTOREU_PART({}, {}, n);")),
        "}",
    ]
    channel = "\n".join("  " + line for line in body)
    out = []
    for name in _POWER_NAMES:
        out.append(f"""\
#define POW pow_{name}
/* Channel c over pixels [p0, p1) of one image: x and y its planes, w the first of the
   taps planes its window sums (HW apart). */
static inline void channel_{name}(const float *x, const float *w, long taps, float *y,
                                  long p0, long p1, vec va, vec vb, vec nb) {{
  long p = p0;
{channel}
}}
#undef POW

static void run_{name}(const float *X, float *Y, float *ws, vec va, vec vb, vec nb,
                       long lo, long hi) {{
  (void)ws;
  for (long item = lo; item < hi; item++) {{
    const long n = item / NTILES, p0 = item % NTILES * PIXELS, p1 = MIN(HW, p0 + PIXELS);
    const float *xn = X + n * C * HW;
    float *yn = Y + n * C * HW;
    for (long c = 0; c < C; c++) {{
      const long k0 = c < LO ? 0 : c - LO, k1 = MIN(C - 1, c + HI);
      /* a whole window has a constant tap count: its loop unrolls */
      if (k1 - k0 + 1 == SIZE)
        channel_{name}(xn + c * HW, xn + k0 * HW, SIZE, yn + c * HW, p0, p1, va, vb, nb);
      else
        channel_{name}(xn + c * HW, xn + k0 * HW, k1 - k0 + 1, yn + c * HW, p0, p1, va, vb,
                       nb);
    }}
  }}
}}
""")
    return "\n".join(out)


def _blocked(op: OpSignature, s: LrnSchedule) -> str:
    """Kernels on blocked tensors: squares staged as per-pixel channel lines, window sums
    as unaligned loads of the line."""
    x = channel_block(op.attr("layout"))
    ragged = op.dim("C") % x != 0

    def outputs(width: int) -> list[str]:
        """Sums and outputs of ``width`` vectors from channel vector ``i``."""
        lines = ["vec " + ", ".join(f"s{v} = VZERO()" for v in range(width)) + ";",
                 "for (long k = 0; k < SIZE; k++) {",
                 "  const float *r = line + i * LANES + k;"]
        lines += [f"  s{v} = VADD(s{v}, VLOADU(r + {v} * LANES));" for v in range(width)]
        lines.append("}")
        for v in range(width):
            at = f"AT(i + {v}, p)"
            lines.append(f"{{ vec o = POW(VLOADU(xn + {at}), s{v}, va, vb, nb);")
            if ragged:
                # the last block's lanes past C: zero, as every blocked kernel writes them
                lines.append(f"  const long c0 = (i + {v}) * LANES;")
                lines.append("  if (c0 + LANES > C) o = VFILL_PART(o, c0 < C ? (int)(C - c0) "
                             ": 0, 0.0f);")
            lines.append(f"  VSTOREU(yn + {at}, o); }}")
        return lines

    pixel = "\n".join("  " + line for line in [
        f"for (; i + {s.vec} <= NV; i += {s.vec}) {{",
        *("  " + line for line in outputs(s.vec)),
        "}",
        "for (; i < NV; i++) {",
        *("  " + line for line in outputs(1)),
        "}",
    ])
    out = ["""\
/* Channel vector i (channels i*LANES ..) of pixel p: in block i / VPB at lane offset
   (i % VPB) * LANES. */
#define AT(i, p) ((((i) / VPB) * HW + (p)) * XB + ((i) % VPB) * LANES)

/* Squares of the channels of pixels [p0, p0 + np) of one image into their lines. */
static inline void stage(const float *xn, float *ws, long p0, long np) {
  for (long b = 0; b < NBLK; b++) {
    const float *xb = xn + (b * HW + p0) * XB;
    for (long j = 0; j < np; j++)
      for (long k = 0; k < XB; k += LANES) {
        const vec v = VLOADU(xb + j * XB + k);
        VSTORE(ws + j * LINE + ORIGIN + b * XB + k, VMUL(v, v));
      }
  }
}
"""]
    for name in _POWER_NAMES:
        out.append(f"""\
#define POW pow_{name}
/* Every channel of pixel p; line: its staged squares, channel c's window starting at c. */
static inline void pixel_{name}(const float *xn, float *yn, const float *line, long p,
                                vec va, vec vb, vec nb) {{
  long i = 0;
{pixel}
}}
#undef POW

static void run_{name}(const float *X, float *Y, float *ws, vec va, vec vb, vec nb,
                       long lo, long hi) {{
  for (long item = lo; item < hi; item++) {{
    const long n = item / NTILES, p0 = item % NTILES * PIXELS, np = MIN(HW - p0, PIXELS);
    const float *xn = X + n * NBLK * HW * XB;
    float *yn = Y + n * NBLK * HW * XB;
    stage(xn, ws, p0, np);
    for (long j = 0; j < np; j++)
      pixel_{name}(xn, yn, ws + j * LINE + ORIGIN - LO, p0 + j, va, vb, nb);
  }}
}}
""")
    return "\n".join(out)


def emit_lrn(op: OpSignature, s: LrnSchedule, d: IsaDialect) -> str:
    """The C translation unit for the lrn ``op`` under ``s`` (validated by the caller)."""
    dims = op.dims_dict
    lo, hi = window(dims["size"])
    plane = dims["H"] * dims["W"]
    consts: dict[str, int | str] = {
        "N": dims["N"], "C": dims["C"], "HW": plane, "SIZE": dims["size"], "LO": lo, "HI": hi,
        "LANES": d.lanes, "PIXELS": s.pixels, "NTILES": -(-plane // s.pixels),
    }
    x = channel_block(op.attr("layout"))
    if x:
        origin, line = _line(op)
        blocks = -(-dims["C"] // x)
        consts.update({"XB": x, "NBLK": blocks, "VPB": x // d.lanes,
                       "NV": blocks * x // d.lanes, "ORIGIN": origin, "LINE": line})
    ws_floats = _workspace_floats(op, s)
    consts["WS_THREAD"] = ws_floats
    kernels = _blocked(op, s) if x else _plain(op, s)
    part = f"""\
static void lrn_part(const float *X, const float *coef, float *Y, float *ws, int tid,
                     int nth) {{
  long lo, hi;
  split_range(N * NTILES, tid, nth, &lo, &hi);
  if (lo >= hi) return;
  ws += tid * WS_THREAD;
  /* the lines' borders stay zero: staging writes channels only */
  for (long i = 0; i < WS_THREAD; i++) ws[i] = 0.0f;
  const vec va = VSET1(coef[0] / (float)SIZE), vb = VSET1(coef[2]), nb = VSET1(-coef[1]);
  if (coef[1] == {FAST_BETA}f) run_p75(X, Y, ws, va, vb, nb, lo, hi);
  else run_any(X, Y, ws, va, vb, nb, lo, hi);
}}
"""
    entry = ("int tc_kernel(void **args) {\n" + unpack_args(op)
             + parallel_entry(s.threads, "lrn_part(X, coef, Y, ws, TID, NTH);",
                              f"{s.threads} * WS_THREAD"))
    return "\n".join([d.prelude, d.log, HEADER, defines(consts), WORKSPACE, _POWERS, kernels,
                      part, entry, TIMER])


def _relayout(op: OpSignature, src: str, dst: str) -> OpSignature | None:
    """X and Y share one layout."""
    return with_attrs(op, layout=src) if src == dst else None


KIND = register(OpKind(
    name="lrn",
    spec=KindSpec(dims=("N", "C", "H", "W", "size"), attrs={"layout": LAYOUTS}, epilogues=()),
    arguments=_arguments,
    flops=_flops,
    schedule=LrnSchedule,
    problems=lrn_problems,
    default_schedule=default_lrn_schedule,
    emit=emit_lrn,
    reference=_reference,
    reduction_length=lambda op: op.dim("size"),
    dim_columns={"N": "dim_batch", "C": "dim_c", "H": "dim_h", "W": "dim_w",
                 "size": "lrn_size"},
    baseline="numpy",
    tolerance=_tolerance,
    random_inputs=_random_inputs,
    layout_slots=lambda op: ("in", None),
    relayout=_relayout,
    examples=(
        "lrn(N=1,C=96,H=55,W=55,size=5,layout=nchw)",  # AlexNet (BVLC), after conv1
        "lrn(N=1,C=256,H=27,W=27,size=5,layout=nchw)",  # AlexNet, after conv2
        # GoogLeNet's stem on blocked activations, as a compiled model runs it
        "lrn(N=1,C=64,H=56,W=56,size=5,layout=nchw16c)",
        "lrn(N=1,C=192,H=56,W=56,size=5,layout=nchw16c)",
    ),
))
