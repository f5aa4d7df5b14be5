"""The cost model's side of ``pwdw``: a roofline of the fused 1x1 + depthwise kernel.

The 1x1 half is an outer-product register tile (``pw_block`` pixels broadcast x one channel
block of vectors) reducing over C, at the micro-kernel efficiency of that tile, less the
epilogue and store each output vector pays once per C steps. The depthwise half loads one
input vector per FMA from the band (in L1 or L2), so it runs at about half the FMA rate.
Rolling the band down moves its shared rows (a read and a write in L1/L2 per byte).
Memory: X, the weights and Y cross memory once; the expanded tensor never does."""

from __future__ import annotations

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.layouts import channel_block
from tunecache.compiler.kinds.pwdw import PwdwSchedule, band_channels, band_floats
from tunecache.compiler.ops import OpSignature
from tunecache.costmodel.analytic import (
    Estimate,
    ceil_div,
    constants,
    micro_efficiency,
    peak_gflops_per_core,
    stream_bytes_per_s,
)
from tunecache.costmodel.kinds import CostKind, FeatureBlock, l2, register

DEPTHWISE_EFFICIENCY = 0.45
"""Share of FMA peak a depthwise tile sustains: one vector load per FMA, two load ports."""

CROWDED = 0.75
"""Register tiles using more of the register file than this ran 5-25% slower (MobileNet-v2's
16 -> 96 channel block at 112x112 on Zen 4: 28-accumulator tiles 0.45-0.53 ms, 14 0.42)."""


def _room(accumulators: int, nv: int, hw: HardwareSpec) -> float:
    """1, or 0.85 for a one-vector register tile that crowds the register file. Tiles of
    two vectors per pixel are not penalised: on the AVX2 Zen 3 VM, the two-block pwdw
    strips of 6 pixels (15 of 16 registers) were the fastest of MobileNet-v2's 112-wide
    16->96 layer, where a crowded one-vector tile broadcasts once per FMA."""
    crowded = nv == 1 and (accumulators + nv + 1) / hw.vector_registers > CROWDED
    return 0.85 if crowded else 1.0


def _items(op: OpSignature, s: PwdwSchedule) -> int:
    """Parallel work items: (image, channel block) pairs, or bands."""
    if s.parallel == "oc":
        return op.dim("N") * op.dim("F") // band_channels(op, s)
    tiles = ceil_div(op.out_h, min(s.oh_block, op.out_h))
    return ceil_div(tiles, s.band_tiles)


def _moved_bytes(op: OpSignature, s: PwdwSchedule) -> float:
    """Bytes the band moves rolling down: ``R - stride`` shared rows per band after the
    first of each channel block (band_tiles=1 at stride 1 moves two rows per new row)."""
    d = op.dims_dict
    th = min(s.oh_block, op.out_h)
    bands = ceil_div(ceil_div(op.out_h, th), s.band_tiles)
    shared = max(0, (d["R"] - 1) * d["dil_h"] + 1 - d["stride_h"])
    row = (d["W"] + d["pad_l"] + d["pad_r"]) * band_channels(op, s) * 4
    return 2.0 * d["N"] * (d["F"] // band_channels(op, s)) * (bands - 1) * shared * row


def _balance(op: OpSignature, s: PwdwSchedule) -> float:
    items = _items(op, s)
    return items / (ceil_div(items, s.threads) * s.threads)


def _pw_efficiency(op: OpSignature, s: PwdwSchedule, hw: HardwareSpec) -> float:
    nv = max(1, band_channels(op, s) // hw.lanes)
    width = min(s.pw_block, op.dim("W"))
    edge = op.dim("W") / (ceil_div(op.dim("W"), width) * width)
    c = op.dim("C")
    return (micro_efficiency(width, nv, constants(hw)) * edge * c / (c + 3.0)
            * _room(width * nv, nv, hw))


def _dw_efficiency(op: OpSignature, s: PwdwSchedule, hw: HardwareSpec) -> float:
    nv = max(1, band_channels(op, s) // hw.lanes)
    acc = min(s.ow_block, op.out_w) * min(s.oh_block, op.out_h) * nv
    return DEPTHWISE_EFFICIENCY * min(1.0, acc / 8) * _room(acc, nv, hw)


def estimate(op: OpSignature, s: PwdwSchedule, hw: HardwareSpec) -> Estimate:
    d = op.dims_dict
    arch = constants(hw)
    peak = peak_gflops_per_core(hw) * 1e9
    pw_flops = 2.0 * d["N"] * d["F"] * d["H"] * d["W"] * d["C"]
    dw_flops = 2.0 * d["N"] * d["F"] * op.out_h * op.out_w * d["R"] * d["S"]
    items = _items(op, s)
    speedup = items / ceil_div(items, s.threads)  # the busiest thread's share sets the time
    copy_s = _moved_bytes(op, s) / (arch.bytes_per_cycle["l2"] * arch.ghz * 1e9)
    compute_s = (pw_flops / (peak * _pw_efficiency(op, s, hw))
                 + dw_flops / (peak * _dw_efficiency(op, s, hw)) + copy_s) / speedup
    moved = float(op.min_bytes)
    memory_s = moved / stream_bytes_per_s(hw, moved, s.threads)
    overhead_s = arch.call_overhead_s + (arch.fork_join_s if s.threads > 1 else 0.0)
    seconds = max(compute_s, memory_s) + overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, memory_s, overhead_s)


def _op_values(op: OpSignature) -> tuple[float, ...]:
    d = op.dims_dict
    return (l2(d["N"]), l2(d["C"]), l2(d["H"]), l2(d["W"]), l2(d["F"]), d["R"], d["S"],
            l2(op.out_h), l2(op.out_w), d["stride_h"], d["stride_w"],
            d["pad_t"] + d["pad_b"], d["pad_l"] + d["pad_r"],
            channel_block(op.attr("layout")), channel_block(op.attr("out_layout")))


def _knob_values(s: PwdwSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    return (s.ow_block, s.oh_block, s.pw_block, s.band_tiles,
            *(float(s.parallel == axis) for axis in ("oc", "pixel")))


def _cross_values(op: OpSignature, s: PwdwSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    return (_balance(op, s), l2(_items(op, s)), _pw_efficiency(op, s, hw),
            l2(band_floats(op, s) * 4 / 1024))


FEATURES = FeatureBlock(
    op_names=("log_conv_n", "log_conv_c", "log_conv_h", "log_conv_w", "log_conv_f", "conv_r",
              "conv_s", "log_conv_p", "log_conv_q", "conv_stride_h", "conv_stride_w",
              "conv_pad_h", "conv_pad_w", "layout_in_block", "layout_out_block"),
    op_values=_op_values,
    knob_names=("ow_block", "oh_block", "pw_block", "band_tiles", "par_oc", "par_pixel"),
    knob_values=_knob_values,
    cross_names=("parallel_balance", "log_parallel_units", "micro_efficiency",
                 "log_band_kib"),
    cross_values=_cross_values,
)

KIND = register(CostKind(name="pwdw", estimate=estimate, features=FEATURES))
