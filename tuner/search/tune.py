"""Tuning one op: tiler pool → ranking (cost model or tiler estimate) → measure → refine.

:func:`tune_op` measures the most promising candidates one at a time, appending every
measurement (failures included) to the store as soon as it exists, so an interrupted job
loses nothing it measured and a rerun continues where it stopped (schedules already measured
for the op, hardware and codegen version are skipped). After the ranked candidates, an
optional local refinement measures neighbours of the best (other K/M blocks, unroll, the
other parallel axis). An optional exploration then measures a fixed, stratified sample of
the whole legal schedule grid (``roller.exhaustive_space``): schedules the tiler would not
propose, so that the cost model also learns from the tiler's mistakes.

Finalists: before exploring, the ``confirm`` fastest schedules measured in this run, the
schedules it was offered first (the incumbent: the store's or the seed's entry, or the
nearest hardware's) and the ranking's first schedule, when they measured ``ok``, are timed
again, unchecked, in ``confirm_rounds`` races, and every measurement is recorded. In a race
(``Runner.race``) the finalists take turns repeat by repeat in one worker, so a slow phase
of a shared machine lands on all of them alike: timed one after another, a schedule 16%
slower won BERT-base's 768x768 matmul on the AVX-512 Xeon VM, whose speed swings by 40%
within seconds (ARCHITECTURE change 74). The incumbent and the ranking's leader join even when
their one timing fell outside the fastest few: a schedule that earlier jobs found best, or
that a compile without this entry would run, should lose only to a challenger that beats it
over the same rounds, not to one lucky timing. Explored schedules that rank first on their
one timing race the best earlier schedule after exploring (:func:`lucky`). A schedule's
figure is then the median of its
measurements' medians, as the index publishes it: on a shared machine a slow phase can
outlast one measurement's repeats, and a fastest schedule timed once 25% slow lost a
BERT-base tuning job (docs/BENCHMARKS.md).

Deadlines: a batch starts only if it is expected to end in time (its size shrinks to the
candidates the remaining time fits, at the cost per candidate seen so far; one candidate while
that cost is unknown), and while a batch runs each kernel's measurement times out at the
deadline (:func:`within`). A measurement cut short by the deadline says nothing about its
schedule, so it is dropped, not recorded. What cannot be cut short (compiling, starting a
worker) can still overrun; the result says by how much (``overrun_s``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule, problems
from tunecache.tuner.kinds import legal_neighbours, tuner_kind
from tunecache.tuner.measure import Candidate, MeasureResult, Runner, TimingConfig
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
    confirm: int = 6
    confirm_rounds: int = 2


@dataclass(frozen=True, slots=True)
class OpTuneResult:
    """What tuning one op produced in this run (earlier runs' measurements not included)."""

    op: OpSignature
    results: tuple[MeasureResult, ...]
    seconds: float
    previously_measured: int = 0
    stopped_by: str | None = None
    error: str | None = None
    overrun_s: float = 0.0
    candidate_s: float | None = None
    retimed: tuple[MeasureResult, ...] = ()
    """The finalists' repeat measurements (not trials: their schedules were measured)."""

    @property
    def best(self) -> MeasureResult | None:
        """The schedule with the lowest median of its measurements' medians, as the
        measurement of it that has that median (the lower middle one)."""
        ranked = by_schedule([*self.results, *self.retimed])
        return ranked[0][1] if ranked else None

    @property
    def trials(self) -> int:
        return len(self.results)


# Below this, a measurement cannot even load and check a kernel: the batch is not started.
MIN_MEASURE_S = 0.05


def within(timing: TimingConfig, remaining_s: float) -> TimingConfig:
    """``timing`` for a measurement that must end within ``remaining_s``: its timeout is at
    most that, and its timed part at most a quarter of it. Unchanged if it already fits."""
    if remaining_s >= timing.timeout_s:
        return timing
    remaining_s = max(remaining_s, MIN_MEASURE_S)
    return replace(timing, timeout_s=remaining_s,
                   min_time_s=min(timing.min_time_s, remaining_s / 4))


def ranked_candidates(op: OpSignature, hw: HardwareSpec, config: TuneConfig,
                      model: Ranker | None = None,
                      weights_packed_once: bool = True) -> list[Candidate]:
    """The tiler's pool, ordered by the cost model when one is given, else by estimate.

    The tiler's best schedule of each algorithm and of each thread count comes first, its
    top-1 leading: the top-1 is
    what an untuned compile runs, so a tuned op is never one the model steered away from a
    better default (a model trained on other layouts or hardware can rank it low), and the
    estimate and a model that has seen few measurements of an algorithm compare algorithms
    too poorly to leave one unmeasured. The kind's challengers of the top-1 (schedules its
    estimate may misjudge, ``TunerKind.challengers``) follow those leaders. When the timing packs
    weights on every call
    (``weights_packed_once`` false), the kind's variants of the top-1 reading its weights in
    place follow it: the tiler and the model rank as if weights were packed once."""
    pool = roller.candidates(op, hw, k=config.pool, threads=config.threads)
    if not pool:
        return []
    kind = tuner_kind(op.kind)
    leaders = roller.leaders_of(pool, lambda c: c.schedule, kind.algorithm)
    first = [Candidate(op, c.schedule, "tiler", c.estimate.seconds) for c in leaders]
    doubts = [s for s in kind.challengers(op, first[0].schedule, hw)
              if not problems(op, s, hw) and all(s != c.schedule for c in first)]
    first += [Candidate(op, s, "tiler") for s in doubts]
    if not weights_packed_once:
        in_place = [s for s in kind.in_place_weights(op, first[0].schedule, hw)
                    if not problems(op, s, hw)]
        first[1:1] = [Candidate(op, s, "tiler") for s in in_place]
    rest = [c for c in pool if c not in leaders]
    if model is None:
        return first + [Candidate(op, c.schedule, "tiler", c.estimate.seconds) for c in rest]
    scores = list(model.predict(op, [c.schedule for c in rest], hw))
    order = sorted(range(len(rest)), key=lambda i: (-scores[i], rest[i].rank))
    return first + [Candidate(op, rest[i].schedule, "model", float(scores[i])) for i in order]


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


def by_schedule(results: Sequence[MeasureResult]) -> list[tuple[float, MeasureResult]]:
    """The ``ok`` results' schedules, fastest first by the median of their medians, each
    with its measurement holding that median (ties: the schedule measured first)."""
    groups: dict[str, list[MeasureResult]] = {}
    for r in results:
        if r.ok and r.median_s and r.schedule is not None:
            groups.setdefault(r.schedule.schedule_id, []).append(r)
    ranked = []
    for group in groups.values():
        ordered = sorted(group, key=lambda r: r.median_s or 0.0)
        middle = ordered[(len(ordered) - 1) // 2]
        ranked.append((float(np.median([r.median_s for r in ordered])), middle))
    return sorted(ranked, key=lambda pair: pair[0])


def finalists(results: Sequence[MeasureResult], offered: Sequence[Schedule],
              count: int) -> list[Schedule]:
    """The ``count`` fastest schedules of ``results`` (by :func:`by_schedule`), then each
    ``offered`` one measured ``ok`` among them and not yet in: the incumbent a job starts
    from stays in the running, so a challenger must beat it over the same rounds (none when
    ``count`` is 0)."""
    if count <= 0:
        return []
    ranked = [r.schedule for _, r in by_schedule(results) if r.schedule is not None]
    chosen = ranked[:count]
    return chosen + [s for s in offered if s in ranked and s not in chosen]


def lucky(results: Sequence[MeasureResult], retimed: Sequence[MeasureResult],
          first_explored: int) -> list[Schedule]:
    """The explored schedules (``results[first_explored:]``) that rank ahead of every
    schedule measured before them, by the median of their timings so far, and the best of
    those: one timing each is all they have, so they race it before one can win. None when
    no explored schedule ranks first.

    On the AVX-512 Xeon VM an explored schedule timed once at 56.1 ms took GPT-2's LM head
    from the raced incumbent (55.8, 59.3 and 57.6 ms); alternating in one process, it ran
    1.14x the incumbent's time."""
    explored = {r.schedule.schedule_id for r in results[first_explored:] if r.schedule}
    ranked = [r.schedule for _, r in by_schedule([*results, *retimed]) if r.schedule]
    ahead: list[Schedule] = []
    for schedule in ranked:
        if schedule.schedule_id not in explored:
            return [*ahead, schedule] if ahead else []
        ahead.append(schedule)
    return []


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
    candidate_s: float | None = None,
    first: Sequence[Schedule] = (),
) -> OpTuneResult:
    """Tune ``op``: measure up to ``config.trials`` ranked candidates, refine, then explore.

    ``first`` are schedules to measure before the ranked ones, within the same trials (the
    schedule the nearest tuned hardware offers, re-fitted here: it competes with the tiler's).

    ``measured`` holds schedule ids already measured for this op (they are skipped);
    ``sink`` receives every result as soon as it is measured; measurement stops at
    ``deadline`` (a ``clock()`` value; ``time.monotonic`` unless given; see the module doc),
    and ``candidate_s``, a guess of one candidate's cost (build and measurement) from earlier
    ops, keeps a first batch that would not fit from starting. Unsupported op kinds give a
    result with ``error`` set rather than an exception, so a job can go on with other ops.
    """
    config = config or TuneConfig()
    start = clock()
    done = set(measured)
    try:
        ranked = ranked_candidates(op, hw, config, model, runner.prepacked(op))
    except ValueError as exc:
        return OpTuneResult(op, (), 0.0, len(done), error=str(exc))
    loop = _Loop(runner, config, sink, deadline, clock, candidate_s)
    budget = max(0, config.trials - len(done))
    offered = [Candidate(op, s, "offered") for s in first]
    todo = _unique([c for c in (*offered, *ranked)
                    if c.schedule.schedule_id not in done])[:budget]
    if loop.run(todo, done) and config.refine and loop.results:
        best = min((r for r in loop.results if r.ok and r.median_s), default=None,
                   key=lambda r: r.median_s or float("inf"))
        if best is not None and best.schedule is not None:
            extra = [Candidate(op, s, "refine") for s in neighbours(op, best.schedule, hw)
                     if s.schedule_id not in done][: config.refine_trials]
            loop.run(extra, done)
    if loop.stopped is None:
        # the ranking's leader is what a compile without this op's entry runs: a challenger
        # replaces it only by beating it over the same rounds
        kept = [c.schedule for c in offered] + [c.schedule for c in ranked[:1]]
        loop.confirm(finalists(loop.results, kept, config.confirm), op)
    if loop.stopped is None and config.explore > 0:
        explored_from = len(loop.results)
        loop.run(exploration(op, hw, config, done), done)
        if loop.stopped is None and config.confirm > 0:
            loop.confirm(lucky(loop.results, loop.retimed, explored_from), op)
    return OpTuneResult(op, tuple(loop.results), clock() - start, len(set(measured)),
                        loop.stopped, overrun_s=loop.overrun_s, candidate_s=loop.candidate_s,
                        retimed=tuple(loop.retimed))


def _unique(candidates: list[Candidate]) -> list[Candidate]:
    seen: set[str] = set()
    out = []
    for c in candidates:
        if c.schedule.schedule_id not in seen:
            seen.add(c.schedule.schedule_id)
            out.append(c)
    return out


class _Loop:
    """Measures candidates in small batches against a deadline (see the module doc)."""

    def __init__(self, runner: Runner, config: TuneConfig,
                 sink: Callable[[MeasureResult], None] | None, deadline: float | None,
                 clock: Callable[[], float], candidate_s: float | None) -> None:
        self.runner = runner
        self.config = config
        self.sink = sink
        self.deadline = deadline
        self.clock = clock
        self.candidate_s = candidate_s
        self.results: list[MeasureResult] = []
        self.retimed: list[MeasureResult] = []
        self.stopped: str | None = None
        self.overrun_s = 0.0

    def run(self, candidates: list[Candidate], done: set[str], retime: bool = False) -> bool:
        """Measure ``candidates`` (adding each measured id to ``done``); False if stopped.
        With ``retime``, they are repeats (see :meth:`_measure`)."""
        queue = list(candidates)
        while queue:
            size = self._batch_size()
            if size == 0:
                self.stopped = "budget"
                return False
            batch, queue = queue[:size], queue[size:]
            started = self.clock()
            if not self._measure(batch, done, retime):
                self.stopped = "budget"
                return False
            if not retime:  # a repeat builds nothing: not a candidate's cost
                self.candidate_s = (self.clock() - started) / len(batch)
        return True

    def confirm(self, finalists: list[Schedule], op: OpSignature) -> None:
        """Time ``finalists`` again, unchecked, in ``confirm_rounds`` races, each starting
        one finalist later (see the module doc); nothing when fewer than two. A race the
        deadline leaves no room for does not start."""
        if len(finalists) < 2:
            return
        for round_ in range(self.config.confirm_rounds):
            shift = round_ % len(finalists)
            order = finalists[shift:] + finalists[:shift]
            if not self._fits(len(order)) or not self._measure(
                    [Candidate(op, s, "confirm") for s in order], set(), retime=True,
                    race=True):
                self.stopped = "budget"
                return

    def _fits(self, count: int) -> bool:
        """Whether ``count`` measurements, at the cost per candidate seen so far, end
        before the deadline."""
        if self.deadline is None:
            return True
        remaining = self.deadline - self.clock()
        return remaining >= max(MIN_MEASURE_S, count * (self.candidate_s or 0.0))

    def _batch_size(self) -> int:
        """How many candidates the next batch may hold: 0 when the deadline leaves no room."""
        if self.deadline is None:
            return self.config.batch
        remaining = self.deadline - self.clock()
        if remaining < MIN_MEASURE_S:
            return 0
        if not self.candidate_s:
            # Cost unknown: one candidate first, so a deadline cuts short at most one
            # measurement (and one worker restart) of an op too big for its share.
            return 1
        return min(self.config.batch, int(remaining // self.candidate_s))

    def _measure(self, batch: list[Candidate], done: set[str], retime: bool = False,
                 race: bool = False) -> bool:
        """One batch, each kernel's measurement bounded by the deadline; False if the
        deadline cut one short (that one is dropped: it says nothing about its schedule).
        With ``retime`` the kernels are not checked again and the results are repeats; with
        ``race`` they are timed against each other (``Runner.race``)."""
        original = self.runner.timing
        base = replace(original, check=False) if retime else original
        cut = False

        def bound() -> None:
            self.runner.timing = base
            if self.deadline is not None:
                self.runner.timing = within(base, self.deadline - self.clock())

        def record(result: MeasureResult) -> None:
            nonlocal cut
            if result.status == "timeout" and self.runner.timing.timeout_s < original.timeout_s:
                cut = True
            else:
                (self.retimed if retime else self.results).append(result)
                if result.schedule is not None:
                    done.add(result.schedule.schedule_id)
                if self.sink is not None:
                    self.sink(result)
            bound()

        bound()
        try:
            (self.runner.race if race else self.runner.measure)(batch, progress=record)
        finally:
            self.runner.timing = original
        if self.deadline is not None:
            self.overrun_s = max(self.overrun_s, self.clock() - self.deadline)
        return not cut
