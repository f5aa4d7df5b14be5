"""Tuning one op: tiler pool → ranking (cost model or tiler estimate) → measure → refine.

:func:`tune_op` measures the most promising candidates one at a time, appending every
measurement (failures included) to the store as soon as it exists, so an interrupted job
loses nothing it measured and a rerun continues where it stopped (schedules already measured
for the op, hardware and codegen version are skipped). After the ranked candidates, an
optional local refinement measures neighbours of the best (other K/M blocks, unroll, the
other parallel axis). An optional exploration then measures a fixed, stratified sample of
the whole legal schedule grid (``roller.exhaustive_space``): schedules the tiler would not
propose, so that the cost model also learns from the tiler's mistakes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule
from tunecache.tuner.kinds import legal_neighbours, tuner_kind
from tunecache.tuner.measure import Candidate, MeasureResult, Runner
from tunecache.tuner.search import roller

POOL_SIZE = 40
EXPLORE_SEED = 7


class Ranker(Protocol):
    """What the tuner needs of a cost model: scores (higher = faster) and a version."""

    @property
    def version(self) -> str: ...

    def predict(self, op: OpSignature, schedules: Sequence[Schedule],
                hw: HardwareSpec) -> Iterable[float]: ...


@dataclass(frozen=True, slots=True)
class TuneConfig:
    """How hard to tune one op."""

    trials: int = 10
    refine: bool = True
    refine_trials: int = 4
    threads: int | None = None
    pool: int = POOL_SIZE
    batch: int = 2
    explore: int = 0


@dataclass(frozen=True, slots=True)
class OpTuneResult:
    """What tuning one op produced in this run (earlier runs' measurements not included)."""

    op: OpSignature
    results: tuple[MeasureResult, ...]
    seconds: float
    previously_measured: int = 0
    stopped_by: str | None = None
    error: str | None = None

    @property
    def best(self) -> MeasureResult | None:
        ok = [r for r in self.results if r.ok and r.median_s]
        return min(ok, key=lambda r: r.median_s or float("inf")) if ok else None

    @property
    def trials(self) -> int:
        return len(self.results)


def ranked_candidates(op: OpSignature, hw: HardwareSpec, config: TuneConfig,
                      model: Ranker | None = None) -> list[Candidate]:
    """The tiler's pool, ordered by the cost model when one is given, else by estimate."""
    pool = roller.candidates(op, hw, k=config.pool, threads=config.threads)
    if model is None:
        return [Candidate(op, c.schedule, "tiler", c.estimate.seconds) for c in pool]
    scores = list(model.predict(op, [c.schedule for c in pool], hw))
    order = sorted(range(len(pool)), key=lambda i: (-scores[i], pool[i].rank))
    return [Candidate(op, pool[i].schedule, "model", float(scores[i])) for i in order]


def neighbours(op: OpSignature, best: Schedule, hw: HardwareSpec) -> list[Schedule]:
    """Legal schedules one step away from ``best`` (its kind's refinement moves)."""
    moves = tuner_kind(op.kind).neighbours(op, best, hw)
    return legal_neighbours(op, best, hw, moves)


def exploration(op: OpSignature, hw: HardwareSpec, config: TuneConfig,
                done: set[str]) -> list[Candidate]:
    """``config.explore`` schedules of the legal grid, the same stratified sample every run
    (so a resumed job measures only what it has not), minus those already measured."""
    sample = roller.exhaustive_space(op, hw, threads=config.threads, limit=config.explore,
                                     seed=EXPLORE_SEED)
    return [Candidate(op, s, "explore") for s in sample if s.schedule_id not in done]


def tune_op(
    op: OpSignature,
    hw: HardwareSpec,
    runner: Runner,
    *,
    config: TuneConfig | None = None,
    model: Ranker | None = None,
    sink: Callable[[MeasureResult], None] | None = None,
    measured: Iterable[str] = (),
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> OpTuneResult:
    """Tune ``op``: measure up to ``config.trials`` ranked candidates, refine, then explore.

    ``measured`` holds schedule ids already measured for this op (they are skipped);
    ``sink`` receives every result as soon as it is measured; measurement stops at
    ``deadline`` (a ``clock()`` value; ``time.monotonic`` unless given). Unsupported op
    kinds give a result with ``error`` set rather than an exception, so a job can go on
    with other ops.
    """
    config = config or TuneConfig()
    start = clock()
    done = set(measured)
    try:
        ranked = ranked_candidates(op, hw, config, model)
    except ValueError as exc:
        return OpTuneResult(op, (), 0.0, len(done), error=str(exc))
    results: list[MeasureResult] = []
    stopped: str | None = None
    budget = max(0, config.trials - len(done))

    def run(candidates: list[Candidate]) -> bool:
        # Small batches: the runner compiles a batch in parallel, and the deadline is
        # checked between batches; every result reaches the sink as soon as it exists.
        nonlocal stopped
        for i in range(0, len(candidates), config.batch):
            if deadline is not None and clock() >= deadline:
                stopped = "budget"
                return False
            batch = candidates[i:i + config.batch]

            def record(result: MeasureResult) -> None:
                results.append(result)
                if sink is not None:
                    sink(result)

            runner.measure(batch, progress=record)
            done.update(c.schedule.schedule_id for c in batch)
        return True

    todo = [c for c in ranked if c.schedule.schedule_id not in done][:budget]
    if run(todo) and config.refine and results:
        best = min((r for r in results if r.ok and r.median_s), default=None,
                   key=lambda r: r.median_s or float("inf"))
        if best is not None and best.schedule is not None:
            extra = [Candidate(op, s, "refine") for s in neighbours(op, best.schedule, hw)
                     if s.schedule_id not in done][: config.refine_trials]
            run(extra)
    if stopped is None and config.explore > 0:
        run(exploration(op, hw, config, done))
    return OpTuneResult(op, tuple(results), clock() - start,
                        len(set(measured)), stopped)
