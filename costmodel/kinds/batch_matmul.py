"""The cost model's side of ``batch_matmul``: matmul's estimate and feature block."""

from __future__ import annotations

from tunecache.costmodel.kinds import CostKind, register
from tunecache.costmodel.kinds.matmul import KIND as MATMUL

KIND = register(CostKind(name="batch_matmul", estimate=MATMUL.estimate, features=MATMUL.features))
