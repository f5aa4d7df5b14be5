"""The ``reorder`` kind: a 4-D activation converted between layouts (``nchw`` and the
channel-blocked ``nchw{x}c`` of :mod:`tunecache.compiler.kinds.layouts`).

Signature: ``reorder(N,C,H,W,src=...,dst=...)``, ``X`` in layout ``src`` into ``Y`` in
layout ``dst`` (they differ). A compiled model converts at its inputs and outputs and around
ops that cannot take a blocked tensor; everything in between stays blocked. No epilogue.

The kernel copies rows: to a blocked layout, each output row ``[W][x]`` of block ``b`` is
filled from the ``x`` input rows of its channels (zeros beyond ``C``); to ``nchw``, each
blocked input row is spread over its channels' output rows; between two block sizes, like
the first with lanes on both sides. The blocked row stays in L1 while it is filled or read,
so the strided side of the copy costs little; the kernel is bound by memory. Threads split
the blocked rows. The schedule has no knob but ``threads``.
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
    random_tensor,
    tensor_shape,
    to_layout,
)
from tunecache.compiler.ops import KindSpec, OpSignature, TensorArg
from tunecache.compiler.schedule import ScheduleData, threads_problem

__all__ = ["ReorderSchedule", "reorder_op"]


@dataclass(frozen=True, slots=True)
class ReorderSchedule(ScheduleData):
    """Knobs of a reorder kernel: its threads only."""

    family: ClassVar[str] = "reorder"

    threads: int = 1

    def __str__(self) -> str:
        return f"t{self.threads}"


def reorder_op(N: int, C: int, H: int, W: int, *, src: str = NCHW, dst: str,
               dtype: str = "float32") -> OpSignature:
    """``X[N,C,H,W]`` stored in ``src`` converted to ``dst``."""
    return OpSignature(KIND.name, (("N", N), ("C", C), ("H", H), ("W", W)), dtype,
                       (("src", src), ("dst", dst)), ())


def _signature_problems(op: OpSignature) -> list[str]:
    if op.attr("src") == op.attr("dst"):
        return [f"src and dst are both {op.attr('src')}; a reorder converts between two "
                "layouts"]
    return []


def _shape(op: OpSignature, layout: str) -> tuple[int, ...]:
    d = op.dims_dict
    return tensor_shape(d["N"], d["C"], d["H"], d["W"], layout)


def _arguments(op: OpSignature) -> tuple[TensorArg, ...]:
    return (TensorArg("X", _shape(op, op.attr("src")), "input"),
            TensorArg("Y", _shape(op, op.attr("dst")), "output"))


def _flops(op: OpSignature) -> int:
    # A copy counts one per element, so rates and intensities stay defined.
    d = op.dims_dict
    return d["N"] * d["C"] * d["H"] * d["W"]


def _reference(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    """The conversion in numpy, in the input's dtype."""
    plain = from_layout(inputs[0], op.attr("src"), op.dim("C"))
    return np.ascontiguousarray(to_layout(plain, op.attr("dst")))


def _random_inputs(op: OpSignature, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    d = op.dims_dict
    return (random_tensor(rng, d["N"], d["C"], d["H"], d["W"], op.attr("src")),)


def _tolerance(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> tuple[float, float]:
    return 0.0, 0.0  # a copy is exact


def reorder_problems(op: OpSignature, s: ReorderSchedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``s`` is illegal for ``op`` on ``hw`` (empty when legal)."""
    return threads_problem(s.threads, hw)


def default_reorder_schedule(op: OpSignature, hw: HardwareSpec,
                             threads: int = 1) -> ReorderSchedule:
    """The only knob: ``threads``."""
    return ReorderSchedule(threads=threads)


# -- C emitter ------------------------------------------------------------------------------

_TO_BLOCKED = """\
/* Output rows (n, b, h) of Y[n][b][h][w][XD]: lane l of each pixel from channel b*XD + l. */
static void reorder_part(const float *restrict X, float *restrict Y, int tid, int nth) {
  long lo, hi;
  split_range(NB * CBD * H, tid, nth, &lo, &hi);
  for (long t = lo; t < hi; t++) {
    const long h = t % H, b = (t / H) % CBD, n = t / (H * CBD);
    float *restrict y = Y + t * (W * XD);
    for (long l = 0; l < XD; l++) {
      const long c = b * XD + l;
      if (c >= C) { for (long w = 0; w < W; w++) y[w * XD + l] = 0.0f; continue; }
      const float *restrict x = SRC_ROW;
      for (long w = 0; w < W; w++) y[w * XD + l] = x[w * XS];
    }
  }
}
"""

_TO_NCHW = """\
/* Input rows (n, b, h) of X[n][b][h][w][XS]: lane l of each pixel to row h of channel
 * b*XS + l of Y[n][c][h][w] (the blocked row stays in L1 while its channels are written). */
static void reorder_part(const float *restrict X, float *restrict Y, int tid, int nth) {
  long lo, hi;
  split_range(NB * CBS * H, tid, nth, &lo, &hi);
  for (long t = lo; t < hi; t++) {
    const long h = t % H, b = (t / H) % CBS, n = t / (H * CBS);
    const float *restrict x = X + t * (W * XS);
    for (long l = 0; l < XS && b * XS + l < C; l++) {
      float *restrict y = Y + ((n * C + b * XS + l) * H + h) * W;
      for (long w = 0; w < W; w++) y[w] = x[w * XS + l];
    }
  }
}
"""


def blocked_copy(name: str) -> str:
    """C of ``name(X, Y, tid, nth)``: this thread's share of the rows of an NCHW ``X`` copied
    into ``Y[n][b][h][w][XD]`` (zero lanes beyond ``C``): this kind's kernel, and the input
    copy of any kernel that computes on a blocked layout but is handed NCHW. The unit defines
    ``NB``, ``C``, ``H``, ``W``, ``XD`` and ``CBD`` and has ``split_range``."""
    return (_TO_BLOCKED.replace("reorder_part", name)
            .replace("SRC_ROW", "X + ((n * C + c) * H + h) * W").replace("x[w * XS]", "x[w]"))


def emit_reorder(op: OpSignature, s: ReorderSchedule, d: IsaDialect) -> str:
    """The C translation unit for the reorder ``op`` under ``s`` (validated by the caller)."""
    dims = op.dims_dict
    xs, xd = channel_block(op.attr("src")), channel_block(op.attr("dst"))
    values = {"NB": dims["N"], "C": dims["C"], "H": dims["H"], "W": dims["W"]}
    if xs:
        values.update(XS=xs, CBS=-(-dims["C"] // xs))
    if xd:
        values.update(XD=xd, CBD=-(-dims["C"] // xd))
        body = (_TO_BLOCKED.replace(
            "SRC_ROW", "X + ((n * CBS + c / XS) * H + h) * W * XS + c % XS")
            if xs else blocked_copy("reorder_part"))
    else:
        body = _TO_NCHW
    constants = "".join(f"#define {k} {v}L\n" for k, v in values.items())
    entry = ("int tc_kernel(void **args) {\n"
             "  const float *X = (const float *)args[0];\n  float *Y = (float *)args[1];\n"
             + parallel_entry(s.threads, "reorder_part(X, Y, TID, NTH);", None))
    return "\n".join([d.prelude, HEADER, constants, WORKSPACE, body, entry, TIMER])


KIND = register(OpKind(
    name="reorder",
    spec=KindSpec(
        dims=("N", "C", "H", "W"),
        attrs={"src": LAYOUTS, "dst": LAYOUTS},
        epilogues=(),
        check=_signature_problems,
    ),
    arguments=_arguments,
    flops=_flops,
    schedule=ReorderSchedule,
    problems=reorder_problems,
    default_schedule=default_reorder_schedule,
    emit=emit_reorder,
    reference=_reference,
    reduction_length=lambda op: 1,
    dim_columns={"N": "dim_batch", "C": "dim_c", "H": "dim_h", "W": "dim_w"},
    baseline="numpy",
    tolerance=_tolerance,
    random_inputs=_random_inputs,
    examples=(
        "reorder(N=1,C=3,H=224,W=224,src=nchw,dst=nchw16c)",  # a CNN's input
        "reorder(N=1,C=2048,H=7,W=7,src=nchw16c,dst=nchw)",  # ResNet-50's last activation
        "reorder(N=1,C=24,H=56,W=56,src=nchw8c,dst=nchw16c)",  # between block sizes
    ),
))
