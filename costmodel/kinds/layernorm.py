"""The cost model's side of ``layernorm``: the row-wise roofline and features.

Per vector of a row: the sums (2: value and square; RMSNorm 1), the normalisation (2) and
the affine step (up to 2), plus the residual add; the three-sweep variant subtracts the mean
once more."""

from __future__ import annotations

from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import ScheduleData
from tunecache.costmodel.kinds import CostKind, register
from tunecache.costmodel.kinds.rowwise import FEATURES, RowCosts, rowwise_estimate


def _ops(op: OpSignature, s: ScheduleData) -> float:
    sums = 2.0 if op.attr("norm") == "layer" else 1.0
    affine = {"gamma_beta": 2.0, "gamma": 1.0, "none": 0.0}[op.attr("affine")]
    residual = 1.0 if op.attr("residual") == "yes" else 0.0
    return sums + 2.0 + affine + residual + (2.0 if s.knobs()["passes"] == 3 else 0.0)


KIND = register(CostKind(name="layernorm", features=FEATURES,
                         estimate=rowwise_estimate(RowCosts(ops=_ops, ilp=1.0, regs=3))))
