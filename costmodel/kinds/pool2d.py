"""The cost model's side of ``pool2d``: the streaming roofline and features.

A windowed pool reduces each output row's ``R`` input rows into a row buffer (vertical pass)
and then ``S`` taps of that buffer per output (horizontal pass); a global pool reduces each
plane once. Blocks of one output row can stall on store-to-load forwarding between the
passes (about 2x on 35x35 planes, under 10% on ResNet's 112x112 max pool)."""

from __future__ import annotations

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.layouts import channel_block
from tunecache.compiler.kinds.pool2d import Pool2dSchedule, is_global
from tunecache.compiler.ops import OpSignature
from tunecache.costmodel.analytic import Estimate, ceil_div, round_up
from tunecache.costmodel.kinds import CostKind, FeatureBlock, l2, register
from tunecache.costmodel.kinds.streaming import streaming_estimate

ROW_BLOCK_PENALTY = {1: 1.1, 2: 1.05, 4: 1.0}


def estimate(op: OpSignature, s: Pool2dSchedule, hw: HardwareSpec) -> Estimate:
    d = op.dims_dict
    planes = d["N"] * d["C"]
    p, q = op.out_h, op.out_w
    x = channel_block(op.attr("layout"))
    if x:
        return _estimate_blocked(op, s, hw, x)
    if is_global(op):
        ops = planes * ceil_div(d["H"] * d["W"], hw.lanes) * 1.5
        penalty = 1.0
    else:
        row_vectors = ceil_div(d["W"] + d.get("pad_l", 0) + d.get("pad_r", 0), hw.lanes)
        vertical = planes * p * row_vectors * (d["R"] + 1)
        horizontal = planes * p * ceil_div(round_up(q, s.ow_block), hw.lanes) * (d["S"] + 1)
        ops = (vertical + horizontal) * 1.5
        penalty = ROW_BLOCK_PENALTY.get(s.rows, 1.0)
    return streaming_estimate(op, hw, threads=s.threads, work_items=planes,
                              vector_ops=ops * penalty, in_flight=s.vec,
                              out_bytes=4.0 * planes * p * q, nontemporal=bool(s.nt))


def _estimate_blocked(op: OpSignature, s: Pool2dSchedule, hw: HardwareSpec, x: int) -> Estimate:
    """Blocked layout: per output pixel, ``x/lanes`` vectors loaded and reduced per window
    tap, no row buffer; threads split output rows."""
    d = op.dims_dict
    blocks = d["N"] * ceil_div(d["C"], x)
    p, q = op.out_h, op.out_w
    vectors = blocks * p * q * max(1, x // hw.lanes)
    ops = vectors * (d["R"] * d["S"] + 1) * 1.5
    return streaming_estimate(op, hw, threads=s.threads, work_items=blocks * p,
                              vector_ops=ops, in_flight=s.vec,
                              out_bytes=4.0 * vectors * hw.lanes, nontemporal=False)


def _op_values(op: OpSignature) -> tuple[float, ...]:
    d = op.dims_dict
    x = channel_block(op.attr("layout"))
    return (l2(d["N"]), l2(d["C"]), l2(d["H"]), l2(d["W"]), d["R"], d["S"], l2(op.out_h),
            l2(op.out_w), d["stride_h"], d["stride_w"], float(op.attr("mode") == "max"),
            float(is_global(op)), x, x)


def _knob_values(s: Pool2dSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    return (s.ow_block, s.vec, s.unroll, s.rows, s.nt)


def _cross_values(op: OpSignature, s: Pool2dSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    q = op.out_w
    planes = op.dim("N") * op.dim("C")
    busiest = ceil_div(planes, s.threads)
    return (q / round_up(q, s.ow_block), planes / (busiest * s.threads),
            l2(planes / s.threads), 4.0 * 4 * op.dim("W") * s.rows / hw.l1d_bytes)


FEATURES = FeatureBlock(
    op_names=("log_conv_n", "log_conv_c", "log_conv_h", "log_conv_w", "conv_r", "conv_s",
              "log_conv_p", "log_conv_q", "conv_stride_h", "conv_stride_w", "pool_max",
              "pool_global", "layout_in_block", "layout_out_block"),
    op_values=_op_values,
    knob_names=("ow_block", "vec_per_step", "step_unroll", "rows_per_block", "nontemporal"),
    knob_values=_knob_values,
    cross_names=("edge_eff_m", "parallel_balance", "log_parallel_units", "fp_l1"),
    cross_values=_cross_values,
)

KIND = register(CostKind(name="pool2d", estimate=estimate, features=FEATURES))
