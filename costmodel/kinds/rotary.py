"""The cost model's side of ``rotary``: a streaming roofline with the tables re-read.

``X`` and ``Y`` cross memory once (the op's minimum bytes count the tables once too); every
group of ``S`` rows after the first re-reads both ``[S, D]`` tables, from L1, L2 or L3
depending on where ``2 * S * D`` floats fit. Per pair of output vectors (one in each half of
a row): six loads (``x`` and two table vectors per half), five arithmetic instructions
(three multiplies, a subtract, an FMA) and two stores; a partial half-vector costs a whole
one plus its mask."""

from __future__ import annotations

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.rotary import RotarySchedule, half_vectors
from tunecache.compiler.ops import OpSignature
from tunecache.costmodel.analytic import Estimate, ceil_div, constants
from tunecache.costmodel.kinds import CostKind, FeatureBlock, l2, register
from tunecache.costmodel.kinds.streaming import streaming_estimate

OPS_PER_PAIR = 13.0


def _table_level(op: OpSignature, hw: HardwareSpec) -> str:
    tables = 8.0 * op.dim("S") * op.dim("D")
    if tables <= 0.5 * hw.l1d_bytes:
        return "l1"
    return "l2" if tables <= 0.5 * hw.l2_bytes else "l3"


def estimate(op: OpSignature, s: RotarySchedule, hw: HardwareSpec) -> Estimate:
    m, d, n_pos = op.dim("M"), op.dim("D"), op.dim("S")
    pairs = m * half_vectors(op, hw.lanes)
    base = streaming_estimate(op, hw, threads=s.threads, work_items=m,
                              vector_ops=pairs * OPS_PER_PAIR, in_flight=2 * s.vec,
                              out_bytes=4.0 * m * d, nontemporal=False)
    arch = constants(hw)
    busy = min(s.threads, max(1, m))
    rereads = 8.0 * max(0, m - n_pos) * d
    reread_s = rereads / (arch.bytes_per_cycle[_table_level(op, hw)] * arch.ghz * 1e9 * busy)
    memory_s = base.memory_s + reread_s
    seconds = max(base.compute_s, memory_s) + base.overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, base.compute_s, memory_s,
                    base.overhead_s)


def _op_values(op: OpSignature) -> tuple[float, ...]:
    return (l2(op.dim("M")), l2(op.dim("D")), l2(op.dim("S")))


def _knob_values(s: RotarySchedule, hw: HardwareSpec) -> tuple[float, ...]:
    return (s.vec, s.unroll)


def _cross_values(op: OpSignature, s: RotarySchedule, hw: HardwareSpec
                  ) -> tuple[float, ...]:
    half = op.dim("D") // 2
    vectors = half_vectors(op, hw.lanes)
    busiest = ceil_div(op.dim("M"), s.threads)
    return (
        half / (vectors * hw.lanes),
        vectors / (s.vec * ceil_div(vectors, s.vec)),
        8.0 * op.dim("S") * op.dim("D") / hw.l2_bytes,
        op.dim("M") / (busiest * s.threads),
        l2(op.dim("M") / s.threads),
    )


FEATURES = FeatureBlock(
    op_names=("log_rows_m", "log_row_n", "log_table_rows"),
    op_values=_op_values,
    knob_names=("vec_per_step", "step_unroll"),
    knob_values=_knob_values,
    cross_names=("edge_eff_n", "row_step_eff", "fp_tables_l2", "parallel_balance",
                 "log_parallel_units"),
    cross_values=_cross_values,
)

KIND = register(CostKind(name="rotary", estimate=estimate, features=FEATURES))
