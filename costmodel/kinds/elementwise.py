"""The cost model's side of ``elementwise``: the streaming roofline and features.

Vector instructions per step, measured roughly on AVX2: an add, multiply or max 1; a
division or square root 4 (their throughput); an exp 18, and the activations built on it
(sigmoid, silu, tanh, the GELUs) 25-50."""

from __future__ import annotations

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.elementwise import BINARY_STEPS, ElementwiseSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.costmodel.analytic import Estimate, ceil_div
from tunecache.costmodel.kinds import CostKind, FeatureBlock, l2, register
from tunecache.costmodel.kinds.streaming import streaming_estimate

STEP_OPS = {"add": 1, "sub": 1, "mul": 1, "div": 4, "relu": 1, "neg": 1, "abs": 1, "clip6": 2,
            "sqrt": 4, "exp": 18, "sigmoid": 25, "silu": 26, "tanh": 35, "gelu_tanh": 45,
            "gelu_erf": 50}
HEAVY = 10


def _ops_per_vector(op: OpSignature) -> float:
    # Loads and the store, then the chain.
    return 2 + sum(STEP_OPS.get(step, 4) for step in op.epilogue)


def estimate(op: OpSignature, s: ElementwiseSchedule, hw: HardwareSpec) -> Estimate:
    m, n = op.dim("M"), op.dim("N")
    vectors = ceil_div(m * n, hw.lanes)
    return streaming_estimate(op, hw, threads=s.threads, work_items=vectors,
                              vector_ops=vectors * _ops_per_vector(op), in_flight=s.vec,
                              out_bytes=4.0 * m * n, nontemporal=bool(s.nt))


def _op_values(op: OpSignature) -> tuple[float, ...]:
    steps = op.epilogue
    operand = op.attr("operand")
    return (l2(op.dim("M")), l2(op.dim("N")), len(steps),
            sum(step in BINARY_STEPS for step in steps),
            sum(STEP_OPS.get(step, 4) >= HEAVY for step in steps), _ops_per_vector(op),
            # col{x} (a per-channel operand of blocked rows) counts as col: one operand
            # vector per row run, like col's broadcast.
            *(float(operand == o or (o == "col" and operand.startswith(o)))
              for o in ("full", "row", "col", "scalar")))


def _knob_values(s: ElementwiseSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    return (s.vec, s.unroll, s.nt)


def _cross_values(op: OpSignature, s: ElementwiseSchedule, hw: HardwareSpec
                  ) -> tuple[float, ...]:
    out_bytes = 4.0 * op.dim("M") * op.dim("N")
    return (out_bytes / hw.l3_bytes, float(op.min_bytes) / hw.l2_bytes)


FEATURES = FeatureBlock(
    op_names=("log_rows_m", "log_row_n", "chain_steps", "chain_binary", "chain_heavy",
              "chain_ops_per_vector", "operand_full", "operand_row", "operand_col",
              "operand_scalar"),
    op_values=_op_values,
    knob_names=("vec_per_step", "step_unroll", "nontemporal"),
    knob_values=_knob_values,
    cross_names=("fp_out_l3", "fp_all_l2"),
    cross_values=_cross_values,
)

KIND = register(CostKind(name="elementwise", estimate=estimate, features=FEATURES))
