"""The cost model's side of the row-wise kinds (``softmax``, ``layernorm``): a bandwidth
roofline and the row-wise schedule family's feature block.

A row-wise kernel streams ``X`` once from memory and writes ``Y`` once; its further sweeps
over a row (``passes``) re-read it from L1 when the interleaved rows fit there, from L2
otherwise. Its vector instructions (per kind: :class:`RowCosts`) run at the vector issue
rate, throttled when too few independent chains (``rows * vec``) cover the latency and when
the chains' live registers spill.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import ScheduleData
from tunecache.costmodel.analytic import Estimate, ceil_div, constants, stream_bytes_per_s
from tunecache.costmodel.kinds import FeatureBlock, l2


@dataclass(frozen=True)
class RowCosts:
    """How one row-wise kind spends its time, per vector of a row.

    ``ops(op, s)``: vector instructions per vector of the row over all sweeps (an exp is
    about 18); ``ilp``: independent instruction streams within one chain (a polynomial exp
    has several; a running sum has one); ``regs``: vector registers one chain keeps live.
    Calibrated on an AVX2 Zen 3 VM (softmax 1536x128 and 64x32000, layernorm 128x768)."""

    ops: Callable[[OpSignature, ScheduleData], float]
    ilp: float
    regs: int


def rowwise_estimate(costs: RowCosts) -> Callable[[OpSignature, ScheduleData, HardwareSpec],
                                                    Estimate]:
    """The estimate of a row-wise kind with ``costs``."""

    def estimate(op: OpSignature, s: ScheduleData, hw: HardwareSpec) -> Estimate:
        arch = constants(hw)
        knobs = s.knobs()
        m, n = op.dim("M"), op.dim("N")
        busy = min(s.threads, max(1, m))
        rows_per_thread = ceil_div(m, busy)
        vectors = ceil_div(n, hw.lanes)
        chains = knobs["rows"] * knobs["vec"]
        eff = min(1.0, 0.25 + 0.375 * chains * costs.ilp)
        spare = max(1, hw.vector_registers - 4)
        spill = 1.0 + 0.25 * max(0, chains * costs.regs - spare) / spare
        per_cycle = arch.fma_pipes * arch.ghz * 1e9
        compute_s = rows_per_thread * vectors * costs.ops(op, s) * spill / (per_cycle * eff)
        stream = stream_bytes_per_s(hw, op.min_bytes, busy)
        block_bytes = 4.0 * knobs["rows"] * n
        level = "l1" if block_bytes <= hw.l1d_bytes * 0.5 else "l2"
        rereads = max(0, knobs["passes"] - 1) * 4.0 * m * n
        memory_s = op.min_bytes / stream + rereads / (
            arch.bytes_per_cycle[level] * arch.ghz * 1e9 * busy)
        overhead_s = arch.call_overhead_s + (arch.fork_join_s if s.threads > 1 else 0.0)
        seconds = max(compute_s, memory_s) + overhead_s
        return Estimate(seconds, op.flops / seconds / 1e9, compute_s, memory_s, overhead_s)

    return estimate


def _op_values(op: OpSignature) -> tuple[float, ...]:
    return (l2(op.dim("M")), l2(op.dim("N")))


def _knob_values(s: ScheduleData, hw: HardwareSpec) -> tuple[float, ...]:
    knobs = s.knobs()
    return (knobs["vec"], knobs["unroll"], knobs["rows"], knobs["passes"])


def _cross_values(op: OpSignature, s: ScheduleData, hw: HardwareSpec) -> tuple[float, ...]:
    knobs = s.knobs()
    m, n = op.dim("M"), op.dim("N")
    vectors = ceil_div(n, hw.lanes)
    blocks = ceil_div(m, knobs["rows"])
    busiest = ceil_div(blocks, s.threads)
    return (
        knobs["rows"] * knobs["vec"],
        4.0 * knobs["rows"] * n / hw.l1d_bytes,
        n / (vectors * hw.lanes),
        vectors / (knobs["vec"] * math.ceil(vectors / knobs["vec"])),
        blocks / (busiest * s.threads),
        l2(blocks / s.threads),
    )


FEATURES = FeatureBlock(
    op_names=("log_rows_m", "log_row_n"),
    op_values=_op_values,
    knob_names=("vec_per_step", "step_unroll", "rows_per_block", "passes"),
    knob_values=_knob_values,
    cross_names=("accumulators", "fp_l1", "edge_eff_n", "row_step_eff", "parallel_balance",
                 "log_parallel_units"),
    cross_values=_cross_values,
)
