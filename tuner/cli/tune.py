"""``tunecache tune``: the nightly tuning job."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from tunecache.cache.store import Store
from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.precision import PRECISIONS
from tunecache.datasets.suites import SUITES, Workload
from tunecache.tuner.cli.common import (
    emit_json,
    hardware_option,
    json_option,
    no_baseline_option,
    parse_duration,
    root_option,
    threads_option,
)
from tunecache.tuner.cli.shapes import (
    InputShapeError,
    input_shape_option,
    open_inputs,
    parse_input_shapes,
    resolve_shapes,
)
from tunecache.tuner.jobs import JobOptions, JobSummary, OpSummary, collect_workloads, run_job
from tunecache.tuner.measure import MeasureResult

log = logging.getLogger("tunecache.tune")

EXIT_INTERRUPTED = 130
EXIT_PARTIAL = 1


class _Progress:
    """Progress on stderr: a tqdm bar on a terminal, plain log lines otherwise."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.quiet = quiet
        self.bar: Any = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="op", file=sys.stderr, dynamic_ncols=True)

    def op_started(self, index: int, total: int, workload: Workload, budget_s: float | None
                   ) -> None:
        budget = f", budget {budget_s:.0f} s" if budget_s is not None else ""
        if self.bar is not None:
            self.bar.set_description(workload.op.text[:60])
        elif not self.quiet:
            log.info("[%d/%d] tuning %s (x%d%s)", index + 1, total, workload.op.text,
                     workload.count, budget)

    def measured(self, result: MeasureResult) -> None:
        if self.bar is not None:
            gflops = f"{result.gflops:.1f} GFLOP/s" if result.gflops else result.status
            self.bar.set_postfix_str(gflops)

    def op_finished(self, summary: OpSummary) -> None:
        if self.bar is not None:
            self.bar.update(1)
        elif not self.quiet:
            best = f"best {summary.best_gflops:.1f} GFLOP/s" if summary.best_gflops else \
                summary.status
            log.info("    %s: %s, %d trials, %.1f s%s", summary.op.op_id, best, summary.trials,
                     summary.seconds, f" ({summary.note})" if summary.note else "")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _print_summary(summary: JobSummary) -> None:
    click.echo(f"job {summary.job_id} on {summary.hw_id}: {len(summary.ops)} ops, "
               f"{summary.trials} trials, {summary.seconds:.1f} s"
               + (" (interrupted)" if summary.interrupted else ""))
    header = f"{'op':<62} {'x':>4} {'status':<11} {'GFLOP/s':>8} {'baseline':>14} {'ratio':>6} " \
             f"{'trials':>6} {'time':>7}"
    click.echo(header)
    click.echo("-" * len(header))
    for o in summary.ops:
        op = o.op.text if len(o.op.text) <= 62 else o.op.text[:59] + "..."
        gflops = f"{o.best_gflops:.1f}" if o.best_gflops else "-"
        base = f"{o.baseline} {o.baseline_gflops:.1f}" if o.baseline_gflops else "-"
        ratio = "noisy" if o.baseline_noisy else f"{o.ratio:.2f}x" if o.ratio else "-"
        click.echo(f"{op:<62} {o.count:>4} {o.status:<11} {gflops:>8} {base:>14} {ratio:>6} "
                   f"{o.trials:>6} {o.seconds:>6.1f}s")
        if o.note and (o.status != "tuned" or o.baseline_noisy):
            click.echo(f"    {o.note}")
    if summary.budget_note:
        click.echo(f"budget: {summary.budget_note}")
    for problem in summary.problems:
        click.echo(f"problem: {problem}")
    if summary.published:
        click.echo(f"published: {', '.join(summary.published)}")
    elif not summary.interrupted and any(o.status == "tuned" for o in summary.ops):
        # A compile serves published entries only: without this, a tuned store looks ignored.
        click.echo("not published: compiles serve published entries only; publish with "
                   f"`tunecache cache publish --root {summary.store}` (or tune with --publish)")
    click.echo(f"store: {summary.store}  (next: tunecache cache stats --root {summary.store})")


@click.command("tune")
@click.option("--suite", "suites", multiple=True, metavar="NAME",
              help=f"A named suite of real-model ops ({', '.join(sorted(SUITES))}). Repeatable.")
@click.option("--op", "ops", multiple=True, metavar="OP", help="An op text. Repeatable.")
@click.option("--model", "models", multiple=True, type=click.Path(path_type=Path),
              help="An ONNX model: every kernel-worthy node, counted. Repeatable.")
@input_shape_option
@click.option("--precision", type=click.Choice(PRECISIONS), default="fp32", show_default=True,
              help="With --model: tune the kernels the model runs when compiled at this "
                   "precision (compile --precision bf16).")
@click.option("--wanted", is_flag=True, help="The ops deployments missed in the cache.")
@click.option("--budget", default=None, metavar="DURATION",
              help="Wall time for the whole job, split by benefit: 600, 90s, 15m, 1h, 1.5h, "
                   "1h30m, 1h30 (= 1h30m).")
@click.option("--trials", type=click.IntRange(min=1), default=10, show_default=True,
              help="Ranked candidates measured per op (plus refinement).")
@click.option("--explore", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also measure this many schedules per op sampled from the whole legal "
                   "grid: training data for the cost model.")
@click.option("--retune", is_flag=True, help="Measure ops again even if already tuned.")
@click.option("--no-refine", is_flag=True, help="Skip the local search around the best.")
@threads_option
@no_baseline_option
@click.option("--publish", is_flag=True, help="Publish the cache for this hardware at the end.")
@click.option("--train", is_flag=True, help="Retrain the cost model at the end.")
@root_option
@click.option("--job-id", default=None, help="Name for this job's records (default: generated).")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS",
              help="Spread ops over a Ray farm (needs tunecache[farm]; --root must be shared).")
@click.option("--quiet", is_flag=True, help="No progress output.")
@hardware_option
@json_option
def tune_command(suites: tuple[str, ...], ops: tuple[str, ...], models: tuple[Path, ...],
                 input_shapes: tuple[str, ...], precision: str, wanted: bool,
                 budget: str | None, trials: int,
                 explore: int, retune: bool, no_refine: bool,
                 threads: int | None, no_baseline: bool, publish: bool, train: bool,
                 root: str | None, job_id: str | None, ray_address: str | None, quiet: bool,
                 hardware: Path | None, as_json: bool) -> None:
    """Tune ops on this machine into the store: the nightly job.

    Every measurement (failures included) is appended to the store as soon as it is made;
    rerunning an interrupted job continues where it stopped.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    budget_s = parse_duration(budget, "--budget") if budget is not None else None
    if not (suites or ops or models or wanted):
        raise click.UsageError("nothing to tune: give --suite, --op, --model or --wanted")
    shapes, problems = _model_shapes(models, parse_input_shapes(input_shapes) or {})
    hw = local_spec(hardware)
    store = Store(root)
    workloads, more = collect_workloads(suites=suites, ops=ops,
                                        models=[m for m in models if str(m) in shapes],
                                        wanted=wanted, store=store, hw=hw, model_shapes=shapes,
                                        precision=precision)
    problems += more
    for problem in problems:
        click.echo(f"warning: {problem}", err=True)
    if not workloads:
        raise TunecacheError("nothing left to tune: " + "; ".join(problems))
    from tunecache.costmodel.registry import usable_model

    model = usable_model(store.location, hw)
    progress = _Progress(len(workloads), quiet or as_json)
    options = JobOptions(budget_s=budget_s, trials=trials, retune=retune, refine=not no_refine,
                         threads=threads, baseline=not no_baseline, job_id=job_id,
                         explore=explore)
    try:
        if ray_address:
            from tunecache.tuner.jobs.farm import FarmPlan, run_farm_job

            [summary] = run_farm_job(ray_address, [FarmPlan(hw, tuple(workloads))], store.root,
                                     options, progress=progress, timeout_s=budget_s)
        else:
            summary = run_job(workloads, hw, store, options, model=model, progress=progress)
    finally:
        progress.close()
    summary.problems.extend(problems)
    if not summary.interrupted and not ray_address:
        # Each measurement was its own fragment (nothing lost on a kill); merge them now.
        store.compact(hw.hw_id)
    if not summary.interrupted:
        if train:
            summary.trained = _train(store)
        if publish:
            results = store.publish(hw.hw_id)
            summary.published = [f"{r.hw_id}: {r.entries} ops in {r.snapshot}" for r in results]
    if as_json:
        emit_json(summary.to_dict())
    else:
        _print_summary(summary)
    if summary.interrupted:
        click.echo(f"interrupted: {summary.trials} measurement(s) kept in {summary.store}; "
                   "the same command continues where it stopped", err=True)
        raise SystemExit(EXIT_INTERRUPTED)
    if problems or any(o.status in ("unsupported", "no_result") for o in summary.ops):
        raise SystemExit(EXIT_PARTIAL)


def _model_shapes(models: tuple[Path, ...], flags: dict[str, list[int]]
                  ) -> tuple[dict[str, dict[str, list[int]] | None], list[str]]:
    """Each ``--model``'s input shapes from the ``--input-shape`` flags naming its inputs
    (completed by dimension names: ``attention_mask`` from ``input_ids``), and one problem
    per model whose dynamic dimensions stay open (left out of the job). A flag that names
    no model's input, or does not fit it, is an error naming the flag."""
    from tunecache.compiler import frontend

    shapes: dict[str, dict[str, list[int]] | None] = {}
    problems: list[str] = []
    named: set[str] = set()
    for path in models:
        try:
            info = frontend.inspect_model(path, check=False)
        except TunecacheError:
            shapes[str(path)] = None  # unreadable: collect_workloads reports it
            continue
        declared = {i.name for i in info.inputs}
        mine = {name: dims for name, dims in flags.items() if name in declared}
        named |= mine.keys()
        resolved = resolve_shapes(info, mine, None)
        if resolved is None:
            problems.append(f"model {path}: {open_inputs(info, 'give --input-shape')}")
            continue
        shapes[str(path)] = resolved if info.dynamic else None
    unknown = [name for name in flags if name not in named]
    if unknown:
        raise InputShapeError(f"--input-shape names {unknown[0]!r}, which is not an input of "
                              + ("any --model" if models else "a --model (none given)"))
    return shapes, problems


def _train(store: Store) -> str | None:
    """Retrain the cost model on every record in the store and make it current."""
    from tunecache.costmodel import registry
    from tunecache.costmodel.model import CostModel

    try:
        model = CostModel.fit(store.load())
        return registry.save(model, store.location)
    except TunecacheError as exc:
        log.warning("cost model not retrained: %s", exc)
        return None


@click.group("farm")
def farm_group() -> None:
    """Run a tuning farm on Ray (needs tunecache[farm])."""


@farm_group.command("worker")
@click.option("--address", required=True, metavar="HOST:PORT", help="The Ray head's address.")
@click.option("--no-block", is_flag=True, help="Return once the node has joined.")
@click.option("--dry-run", is_flag=True, help="Print the ray command instead of running it.")
@hardware_option
def farm_worker_command(address: str, no_block: bool, dry_run: bool,
                        hardware: Path | None) -> None:
    """Join this machine to the farm, offering one measurement slot for its hw_id."""
    from tunecache.tuner.jobs.farm import join_farm, worker_command

    hw = local_spec(hardware)
    if dry_run:
        click.echo(" ".join(worker_command(address, hw, block=not no_block)))
        return
    click.echo(f"joining {address} as {hw.hw_id}", err=True)
    raise SystemExit(join_farm(address, hw, block=not no_block))


COMMANDS: list[click.Command] = [tune_command, farm_group]
