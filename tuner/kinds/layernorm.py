"""The tuner's side of ``layernorm``: the row-wise grid."""

from __future__ import annotations

from tunecache.compiler.kinds.layernorm import LayernormSchedule
from tunecache.tuner.kinds import register
from tunecache.tuner.kinds.rowwise import rowwise_kind

KIND = register(rowwise_kind("layernorm", LayernormSchedule))
