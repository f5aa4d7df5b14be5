"""The tuner's side of ``softmax``: the row-wise grid."""

from __future__ import annotations

from tunecache.compiler.kinds.softmax import SoftmaxSchedule
from tunecache.tuner.kinds import register
from tunecache.tuner.kinds.rowwise import rowwise_kind

KIND = register(rowwise_kind("softmax", SoftmaxSchedule))
