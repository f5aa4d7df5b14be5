"""The cost model's side of ``reorder``: the streaming roofline and features.

A reorder moves each element once, one scalar load and store per element (the strided side
of the copy stays in L1), so it is bound by memory unless the tensor fits the cache."""

from __future__ import annotations

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.layouts import channel_block
from tunecache.compiler.kinds.reorder import ReorderSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.costmodel.analytic import Estimate, ceil_div
from tunecache.costmodel.kinds import CostKind, FeatureBlock, l2, register
from tunecache.costmodel.kinds.streaming import streaming_estimate


def _rows(op: OpSignature) -> int:
    """Blocked rows (of Y, else of X): the parallel work items."""
    d = op.dims_dict
    x = channel_block(op.attr("dst")) or channel_block(op.attr("src"))
    return d["N"] * ceil_div(d["C"], x) * d["H"]


def estimate(op: OpSignature, s: ReorderSchedule, hw: HardwareSpec) -> Estimate:
    elements = 1
    for size in op.arguments()[-1].shape:
        elements *= size
    # Scalar copies: a load and a store per element, at the issue rate.
    return streaming_estimate(op, hw, threads=s.threads, work_items=_rows(op),
                              vector_ops=2.0 * elements, in_flight=1,
                              out_bytes=4.0 * elements, nontemporal=False)


def _op_values(op: OpSignature) -> tuple[float, ...]:
    d = op.dims_dict
    return (l2(d["N"]), l2(d["C"]), l2(d["H"]), l2(d["W"]),
            channel_block(op.attr("src")), channel_block(op.attr("dst")))


def _knob_values(s: ReorderSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    return ()


def _cross_values(op: OpSignature, s: ReorderSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    rows = _rows(op)
    busiest = ceil_div(rows, s.threads)
    return (rows / (busiest * s.threads), l2(rows / s.threads))


FEATURES = FeatureBlock(
    op_names=("log_conv_n", "log_conv_c", "log_conv_h", "log_conv_w", "layout_in_block",
              "layout_out_block"),
    op_values=_op_values,
    knob_names=(),
    knob_values=_knob_values,
    cross_names=("parallel_balance", "log_parallel_units"),
    cross_values=_cross_values,
)

KIND = register(CostKind(name="reorder", estimate=estimate, features=FEATURES))
