"""Where a native program's time goes: per-step timings taken inside the runner.

:meth:`NativeProgram.profile <tunecache.compiler.native.program.NativeProgram.profile>`
times every step where it runs (a kernel or a copy inside the C runner, a numpy bridge in
Python) and the whole run around them; this module holds the values and their summaries,
as ``tunecache run --profile`` prints them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

WHERE = ("kernel", "copy", "numpy", "reference")
"""Where a step runs: a generated kernel, a strided copy of the runner, numpy, or ONNX's
reference implementation (:mod:`tunecache.compiler.onnx_ops.reference`, slow)."""


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One step of a program: the graph node it runs, its op (the kernel's op kind, or the
    ONNX op type), and where it runs (one of :data:`WHERE`)."""

    node: str
    op: str
    where: str


@dataclass(frozen=True, slots=True)
class StepTime:
    """A step and its median seconds per run."""

    index: int
    step: StepInfo
    seconds: float


@dataclass(frozen=True)
class ProgramProfile:
    """Median seconds per step over ``runs`` runs, and of the whole run."""

    steps: tuple[StepTime, ...]
    runs: int
    run_seconds: float
    """Median wall seconds of a whole run, Python between the native calls included."""
    outside_seconds: float
    """Median over runs of a run's time outside every step: Python's per-run work
    (checking inputs, output buffers, handing values between segments). Taken run by run,
    not as a difference of medians, which noise in the steps would inflate."""

    @classmethod
    def of(cls, infos: Sequence[StepInfo], samples: np.ndarray,
           walls: Sequence[float]) -> ProgramProfile:
        """From per-run samples (``runs x steps`` seconds) and whole-run wall seconds."""
        medians = np.median(samples, axis=0) if len(samples) else np.zeros(len(infos))
        steps = tuple(StepTime(i, info, float(m))
                      for i, (info, m) in enumerate(zip(infos, medians, strict=True)))
        if not walls:
            return cls(steps, 0, 0.0, 0.0)
        outside = [max(w - float(row.sum()), 0.0) for w, row in zip(walls, samples, strict=True)]
        return cls(steps, len(walls), statistics.median(walls), statistics.median(outside))

    @property
    def step_seconds(self) -> float:
        """Sum of the steps' medians."""
        return sum(s.seconds for s in self.steps)

    def seconds_by(self, field: str) -> dict[str, float]:
        """Seconds per ``op`` or per ``where`` (largest first)."""
        totals: dict[str, float] = {}
        for step in self.steps:
            key = getattr(step.step, field)
            totals[key] = totals.get(key, 0.0) + step.seconds
        return dict(sorted(totals.items(), key=lambda kv: -kv[1]))

    def top(self, count: int) -> list[StepTime]:
        """The ``count`` slowest steps, slowest first."""
        return sorted(self.steps, key=lambda s: -s.seconds)[:count]

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "runs": self.runs, "run_ms": self.run_seconds * 1e3,
            "outside_steps_ms": self.outside_seconds * 1e3,
            "by_where_ms": {k: v * 1e3 for k, v in self.seconds_by("where").items()},
            "by_op_ms": {k: v * 1e3 for k, v in self.seconds_by("op").items()},
            "steps": [{"index": s.index, "node": s.step.node, "op": s.step.op,
                       "where": s.step.where, "ms": s.seconds * 1e3} for s in self.steps],
        }
