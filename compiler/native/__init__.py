"""Whole-model native execution: a static arena, a plan of kernel calls as plain data, and
a generic C runner that walks it (see :class:`~tunecache.compiler.native.program.NativeProgram`)."""

from tunecache.compiler.native.arena import ArenaPlan, Lifetime, plan_arena
from tunecache.compiler.native.program import NativeProgram, PlanMismatch

__all__ = ["ArenaPlan", "Lifetime", "NativeProgram", "PlanMismatch", "plan_arena"]
