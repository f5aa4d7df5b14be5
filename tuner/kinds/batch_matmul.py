"""The tuner's side of ``batch_matmul``: matmul's pool, grid and moves (plus the batch axis,
which matmul's code offers whenever the op has a batch dim)."""

from __future__ import annotations

from dataclasses import replace

from tunecache.tuner.kinds import register
from tunecache.tuner.kinds.matmul import KIND as MATMUL

KIND = register(replace(MATMUL, name="batch_matmul"))
