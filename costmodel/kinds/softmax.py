"""The cost model's side of ``softmax``: the row-wise roofline and features.

Per vector of a row: the max (1), the scale, mask and subtraction (up to 3), the exp (~18),
the sum (1) and the normalising multiply (1); the online two-sweep variant also rescales its
running sum with a second exp per step (measured about twice the three-sweep time)."""

from __future__ import annotations

from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import ScheduleData
from tunecache.costmodel.kinds import CostKind, register
from tunecache.costmodel.kinds.rowwise import FEATURES, RowCosts, rowwise_estimate


def _ops(op: OpSignature, s: ScheduleData) -> float:
    extra = (op.attr("scale") == "yes") + (op.dim("mask_rows") > 0)
    three = 22.0 + extra
    return three if s.knobs()["passes"] == 3 else 2.0 * three


KIND = register(CostKind(name="softmax", features=FEATURES,
                         estimate=rowwise_estimate(RowCosts(ops=_ops, ilp=3.0, regs=4))))
