"""Whole-model native execution: a static arena, a plan of kernel calls as plain data, and
a generic C runner that walks it (see :class:`~tunecache.compiler.native.program.NativeProgram`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunecache.compiler.native.arena import ArenaPlan, Lifetime, plan_arena
    from tunecache.compiler.native.program import NativeProgram, PlanMismatch

__all__ = ["ArenaPlan", "Lifetime", "NativeProgram", "PlanMismatch", "plan_arena"]

_HOMES = {"ArenaPlan": "arena", "Lifetime": "arena", "plan_arena": "arena",
          "NativeProgram": "program", "PlanMismatch": "program"}


def __getattr__(name: str) -> Any:
    # Imported on first use: the measurement worker loads the runner library (its timer)
    # and should not import the program and the ONNX frontend it needs.
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
