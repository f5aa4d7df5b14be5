"""Nightly tuning jobs: gather workloads, split a time budget, tune, record, summarise.

A job tunes the distinct ops of its workloads (suites, op texts, ONNX models, the wanted list)
on this machine, most expected benefit first (FLOPs x occurrences). With a wall-time budget,
each op gets the remaining time in proportion to its weight among the ops still to do, so time
an op does not use flows to the rest. Every measurement is appended to the store as soon as
it exists; ops already tuned for this hardware and codegen version (at least ``trials`` +
``explore`` schedules measured) are skipped unless ``retune``; a rerun after Ctrl-C or SIGKILL continues
where the job stopped. At the end the job can retrain the cost model and publish the cache.

The budget covers tuning and the baselines: each op's share ends its measurements
(:func:`~tunecache.tuner.search.tune_op` stops batches at the deadline and bounds each
measurement by it), a tenth of it is kept for the op's baseline, and an overrun (compiling or
starting a worker cannot be cut short) is reported in the summary with its cause. A baseline
whose repeats still spread beyond the runner's noise tolerance after a retime is flagged
``baseline_noisy`` and no ratio is computed from it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow.compute as pc

from tunecache.cache.nearest import CacheView, serving_view
from tunecache.cache.store import Store
from tunecache.cache.wanted import load_wanted
from tunecache.compiler.codegen import CODEGEN_VERSION
from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule
from tunecache.datasets.suites import Workload, get_suite
from tunecache.tuner.measure import MeasureResult, Runner, TimingConfig
from tunecache.tuner.measure.baseline import baseline_is_noisy, measure_baseline
from tunecache.tuner.measure.records import to_records
from tunecache.tuner.search import OpTuneResult, Ranker, TuneConfig, tune_op
from tunecache.tuner.search.refit import Nearest
from tunecache.tuner.search.tune import MIN_MEASURE_S, within

# The part of an op's budget share kept for timing its baseline after tuning.
BASELINE_SHARE = 0.1


@dataclass(frozen=True, slots=True)
class JobOptions:
    """How a job runs. ``budget_s`` is wall time for the whole job (None: no limit);
    ``explore`` schedules per op are drawn from the whole grid for the cost model;
    ``nearest``: an op this hardware has not published starts from the schedule of the
    nearest tuned hardware (re-fitted here), measured first within the trials."""

    budget_s: float | None = None
    trials: int = 10
    retune: bool = False
    refine: bool = True
    threads: int | None = None
    baseline: bool = True
    explore: int = 0
    job_id: str | None = None
    nearest: bool = True


@dataclass(frozen=True, slots=True)
class OpSummary:
    """One line of the job's summary table."""

    op: OpSignature
    label: str
    count: int
    status: str  # tuned, skipped, unsupported, no_result, interrupted
    trials: int
    seconds: float
    best_gflops: float | None = None
    best_schedule: str | None = None
    baseline: str | None = None
    baseline_gflops: float | None = None
    note: str | None = None
    baseline_noisy: bool = False

    @property
    def ratio(self) -> float | None:
        """Best GFLOP/s over the baseline's; None without both, or if the baseline's timing
        was too noisy to trust."""
        if self.best_gflops and self.baseline_gflops and not self.baseline_noisy:
            return self.best_gflops / self.baseline_gflops
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op.text, "op_id": self.op.op_id, "label": self.label,
            "count": self.count, "status": self.status, "trials": self.trials,
            "seconds": round(self.seconds, 3), "best_gflops": self.best_gflops,
            "best_schedule": self.best_schedule, "baseline": self.baseline,
            "baseline_gflops": self.baseline_gflops, "ratio_to_baseline": self.ratio,
            "baseline_noisy": self.baseline_noisy, "note": self.note,
        }


@dataclass
class JobSummary:
    """What a job did."""

    job_id: str
    hw_id: str
    store: str
    ops: list[OpSummary] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    interrupted: bool = False
    published: list[str] = field(default_factory=list)
    trained: str | None = None
    budget_s: float | None = None
    over_budget_s: float = 0.0
    budget_note: str | None = None

    @property
    def trials(self) -> int:
        return sum(o.trials for o in self.ops)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "hw_id": self.hw_id, "store": self.store,
            "seconds": round(self.seconds, 3), "interrupted": self.interrupted,
            "trials": self.trials, "problems": self.problems, "published": self.published,
            "trained_model": self.trained, "budget_s": self.budget_s,
            "over_budget_s": round(self.over_budget_s, 3), "budget_note": self.budget_note,
            "ops": [o.to_dict() for o in self.ops],
        }


class JobProgress(Protocol):
    """Hooks a front end implements to show progress (all optional no-ops by default)."""

    def op_started(self, index: int, total: int, workload: Workload, budget_s: float | None
                   ) -> None: ...

    def measured(self, result: MeasureResult) -> None: ...

    def op_finished(self, summary: OpSummary) -> None: ...


class SilentProgress:
    """A :class:`JobProgress` that shows nothing."""

    def op_started(self, index: int, total: int, workload: Workload, budget_s: float | None
                   ) -> None:
        return None

    def measured(self, result: MeasureResult) -> None:
        return None

    def op_finished(self, summary: OpSummary) -> None:
        return None


# -- workloads -----------------------------------------------------------------------------


def merge_workloads(workloads: Iterable[Workload]) -> list[Workload]:
    """One workload per distinct op (counts summed, labels joined), heaviest first."""
    merged: dict[OpSignature, Workload] = {}
    for w in workloads:
        old = merged.get(w.op)
        merged[w.op] = w if old is None else Workload(
            w.op, old.count + w.count, f"{old.label}; {w.label}")
    return sorted(merged.values(), key=lambda w: (-w.weight, w.op.text))


def collect_workloads(
    *,
    suites: Sequence[str] = (),
    ops: Sequence[str] = (),
    models: Sequence[str | Path] = (),
    wanted: bool = False,
    store: Store | None = None,
    hw: HardwareSpec | None = None,
    model_shapes: Mapping[str, Mapping[str, Sequence[int]] | None] | None = None,
    precision: str = "fp32",
) -> tuple[list[Workload], list[str]]:
    """Workloads from every source, and one message per source that could not be used.

    A bad source (unknown suite, malformed op text, unreadable model) is reported and
    skipped; the others are still used. ``model_shapes`` fixes dynamic input shapes per
    model (keyed by the model's path as given); ``precision`` is the one the models will be
    compiled at (their kernels at it are tuned).
    """
    found: list[Workload] = []
    problems: list[str] = []
    for name in suites:
        try:
            suite = get_suite(name)
        except TunecacheError as exc:
            problems.append(str(exc))
            continue
        found += [Workload(w.op, w.count, f"{name}: {w.label}") for w in suite.workloads]
    for text in ops:
        try:
            found.append(Workload(OpSignature.parse(text), 1, "--op"))
        except TunecacheError as exc:
            problems.append(str(exc))
    for path in models:
        try:
            found += model_workloads(path, hw, (model_shapes or {}).get(str(path)), precision)
        except TunecacheError as exc:
            problems.append(f"model {path}: {exc}")
    if wanted:
        if store is None or hw is None:
            raise ValueError("the wanted list needs a store and a hardware spec")
        wanted_ops = load_wanted(store.location, hw.hw_id)
        if not wanted_ops:
            problems.append(f"the wanted list of {hw.hw_id} in {store.root} is empty")
        found += [Workload(w.op, w.count, "wanted" + (f" by {', '.join(w.models)}"
                                                      if w.models else ""))
                  for w in wanted_ops]
    return merge_workloads(found), problems


def model_workloads(path: str | Path, hw: HardwareSpec | None = None,
                    input_shapes: Mapping[str, Sequence[int]] | None = None,
                    precision: str = "fp32") -> list[Workload]:
    """The kernel ops of an ONNX model, counted: with ``hw``, the ops (layouts and
    reorders included) that the model compiled for ``hw`` at ``precision`` runs;
    ``input_shapes`` fixes its dynamic inputs (a transformer export's batch and sequence)."""
    from tunecache.compiler import frontend

    return [Workload(op, count, f"{Path(path).name}: {label}")
            for op, count, label in frontend.kernel_ops(path, input_shapes, hw=hw,
                                                        precision=precision)]


# -- the job -------------------------------------------------------------------------------


def measured_schedules(store: Store, hw: HardwareSpec, ops: Sequence[OpSignature]
                       ) -> dict[str, set[str]]:
    """Schedule ids already measured per op_id on ``hw`` with the running codegen version."""
    if not ops:
        return {}
    table = store.scan(hw_id=hw.hw_id, op=list(ops),
                       columns=["op_id", "schedule_id", "codegen_version"])
    table = table.filter(pc.and_(pc.equal(table["codegen_version"], CODEGEN_VERSION),
                                 pc.is_valid(table["schedule_id"])))
    out: dict[str, set[str]] = {}
    for op_id, schedule_id in zip(table["op_id"].to_pylist(), table["schedule_id"].to_pylist(),
                                  strict=True):
        out.setdefault(op_id, set()).add(schedule_id)
    return out


def _offer_view(store: Store, hw: HardwareSpec) -> CacheView | None:
    """What the store and the seed offer this hardware; None when they cannot be read (the
    job then starts every op from the tiler, as it always could)."""
    try:
        return serving_view(store.location, hw)
    except Exception:  # offers are a head start, never a reason to fail a job
        return None


def _offers(view: CacheView | None, op: OpSignature, hw: HardwareSpec) -> list[Schedule]:
    """The nearest tuned hardware's (or shape's) schedule for ``op``, re-fitted to ``hw``;
    or the seed's own entry for this hardware, so a short job never publishes a schedule
    slower than the one a fresh install is already served (none when the job's store has
    an entry of this hardware, or nothing legal here is offered)."""
    try:
        served = view.lookup(op) if view is not None else None
    except Exception:  # a damaged neighbour snapshot is skipped like a missing one
        return []
    if served is None or view is None or (served.exact and served.store != "seed"):
        return []
    fitted = Nearest.from_served(served, view).fitted(op, hw)
    return [fitted] if fitted is not None else []


def run_job(
    workloads: Sequence[Workload],
    hw: HardwareSpec,
    store: Store,
    options: JobOptions | None = None,
    *,
    model: Ranker | None = None,
    progress: JobProgress | None = None,
    runner: Runner | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> JobSummary:
    """Tune ``workloads`` on ``hw`` into ``store``; returns the summary (also when interrupted).

    A KeyboardInterrupt stops the job after recording what was measured; the summary says
    ``interrupted``. Pass ``runner`` to reuse a worker (tests); otherwise one is made.
    """
    options = options or JobOptions()
    progress = progress or SilentProgress()
    view = _offer_view(store, hw) if options.nearest and options.threads is None else None
    job_id = options.job_id or f"tune-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    summary = JobSummary(job_id, hw.hw_id, store.root, budget_s=options.budget_s)
    start = clock()
    end = start + options.budget_s if options.budget_s is not None else None
    todo = merge_workloads(workloads)
    measured = {} if options.retune else measured_schedules(store, hw, [w.op for w in todo])
    config = TuneConfig(trials=options.trials, refine=options.refine, threads=options.threads,
                        explore=options.explore)
    model_version = getattr(model, "version", None) if model is not None else None
    own_runner = runner is None
    runner = runner or Runner(hw, TimingConfig(min_time_s=0.1, min_repeats=5))
    overruns: list[str] = []
    candidate_s: float | None = None

    def sink(result: MeasureResult) -> None:
        store.append(to_records([result], hw, job_id=job_id, model_version=model_version))
        progress.measured(result)

    try:
        for index, workload in enumerate(todo):
            op = workload.op
            already = measured.get(op.op_id, set())
            skipped = _skipped(workload, already, options)
            if skipped is not None:
                summary.ops.append(skipped)
                progress.op_finished(skipped)
                continue
            share, op_end, tune_end = _op_deadlines(todo, index, end, options, clock)
            progress.op_started(index, len(todo), workload, share)
            try:
                result = tune_op(op, hw, runner, config=config, model=model, sink=sink,
                                 measured=already, deadline=tune_end, clock=clock,
                                 candidate_s=candidate_s, first=_offers(view, op, hw))
            except KeyboardInterrupt:
                summary.interrupted = True
                item = OpSummary(op, workload.label, workload.count, "interrupted", 0, 0.0)
                summary.ops.append(item)
                break
            if result.candidate_s is not None:
                candidate_s = min(candidate_s or result.candidate_s, result.candidate_s)
            if result.overrun_s > 0:
                overruns.append(_overrun(op, result))
            item = _summarise(workload, result, runner, options, op_end, clock)
            summary.ops.append(item)
            progress.op_finished(item)
    except KeyboardInterrupt:
        summary.interrupted = True
    finally:
        if own_runner:
            runner.close()
        summary.seconds = clock() - start
    _note_over_budget(summary, options, overruns)
    return summary


def _skipped(workload: Workload, already: set[str], options: JobOptions) -> OpSummary | None:
    """The summary of an op the store already holds enough measurements of (``already``:
    its schedules measured on this hardware), or None when it is to be tuned."""
    if options.retune or len(already) < options.trials + options.explore:
        return None
    return OpSummary(workload.op, workload.label, workload.count, "skipped", 0, 0.0,
                     note=f"already tuned: {len(already)} schedules measured "
                          f"(--retune to measure again)")


def _op_deadlines(todo: Sequence[Workload], index: int, end: float | None, options: JobOptions,
                  clock: Callable[[], float]
                  ) -> tuple[float | None, float | None, float | None]:
    """Op ``index``'s share of the time left before the job's ``end`` (in proportion to its
    weight among the ops still to do), when its share ends and when its tuning must end to
    leave time for its baseline; all None without a budget."""
    if end is None:
        return None, None, None
    now = clock()
    remaining_weight = sum(w.weight for w in todo[index:]) or 1.0
    share = max(0.0, (end - now) * todo[index].weight / remaining_weight)
    op_end = now + share
    return share, op_end, op_end - (share * BASELINE_SHARE if options.baseline else 0.0)


def _overrun(op: OpSignature, result: OpTuneResult) -> str:
    """What the summary says of a batch that ended past the op's tuning deadline."""
    return (f"{op.op_id}: a batch ended {result.overrun_s:.1f} s past its tuning deadline "
            "(compiling and starting a worker cannot be cut short)")


def _note_over_budget(summary: JobSummary, options: JobOptions, overruns: list[str]) -> None:
    """Record in ``summary`` by how much the job exceeded its budget, and why."""
    if options.budget_s is not None and summary.seconds > options.budget_s:
        summary.over_budget_s = summary.seconds - options.budget_s
        why = "; ".join(overruns) if overruns else \
            "time outside measurements (ranking candidates, recording results)"
        summary.budget_note = (f"budget {options.budget_s:g} s exceeded by "
                               f"{summary.over_budget_s:.1f} s: {why}")


def _baseline(op: OpSignature, threads: int, runner: Runner
              ) -> tuple[str | None, float | None, bool]:
    """The kind's baseline (numpy, or onnxruntime when installed) at the same thread count:
    its name, GFLOP/s, and whether its timing was too noisy to compare with."""
    base = measure_baseline(op, threads, runner)
    if base is None or not base.ok or not base.gflops:
        return None, None, False
    return base.source, base.gflops, baseline_is_noisy(base, runner.timing)


def _timed_baseline(op: OpSignature, threads: int, runner: Runner, deadline: float | None,
                    clock: Callable[[], float]) -> tuple[str | None, float | None, bool, str | None]:
    """:func:`_baseline` bounded by ``deadline``: skipped (with a note) when none is left; a
    baseline that fails is a note, never the job's end (the tuned schedule stands)."""
    if deadline is None:
        return _noted_baseline(op, threads, runner)
    remaining = deadline - clock()
    if remaining < MIN_MEASURE_S:
        return None, None, False, "baseline skipped: the op's budget was spent"
    original = runner.timing
    runner.timing = within(original, remaining)
    try:
        return _noted_baseline(op, threads, runner)
    finally:
        runner.timing = original


def _noted_baseline(op: OpSignature, threads: int, runner: Runner
                    ) -> tuple[str | None, float | None, bool, str | None]:
    try:
        return (*_baseline(op, threads, runner), None)
    except Exception as exc:  # a peer refusing the op ends only the comparison
        return None, None, False, f"baseline failed: {type(exc).__name__}: {exc}"


def _summarise(workload: Workload, result: OpTuneResult, runner: Runner,
               options: JobOptions, deadline: float | None = None,
               clock: Callable[[], float] = time.monotonic) -> OpSummary:
    op = workload.op
    if result.error is not None:
        return OpSummary(op, workload.label, workload.count, "unsupported", 0, result.seconds,
                         note=result.error)
    best = result.best
    if best is None:
        failures = {r.status for r in result.results}
        note = ("no candidate ran" if not result.results else
                "every candidate failed: " + ", ".join(sorted(failures)))
        if result.stopped_by:
            note += f" (stopped by {result.stopped_by})"
        return OpSummary(op, workload.label, workload.count, "no_result", result.trials,
                         result.seconds, note=note)
    baseline_name: str | None = None
    baseline_gflops: float | None = None
    noisy = False
    notes = [f"stopped by {result.stopped_by}"] if result.stopped_by else []
    if options.baseline and best.schedule is not None:
        baseline_name, baseline_gflops, noisy, skipped = _timed_baseline(
            op, best.schedule.threads, runner, deadline, clock)
        notes += [skipped] if skipped else []
        notes += ["baseline too noisy to compare (spread beyond the noise tolerance after a "
                  "retime)"] if noisy else []
    return OpSummary(op, workload.label, workload.count, "tuned", result.trials, result.seconds,
                     best.gflops, str(best.schedule), baseline_name, baseline_gflops,
                     "; ".join(notes) or None, noisy)
