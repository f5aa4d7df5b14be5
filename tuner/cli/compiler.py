"""``tunecache hw`` and ``tunecache bench-op``: the machine, and one kernel against numpy."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import click

from tunecache.compiler.files import open_regular
from tunecache.compiler.hardware import HardwareSpec, local_spec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import default_schedule, problems, schedule_from_json, validate
from tunecache.tuner.cli.common import (
    emit_json,
    hardware_option,
    json_option,
    no_baseline_option,
    root_option,
    threads_option,
    threads_option_with,
)
from tunecache.tuner.measure import Candidate, MeasureResult, Runner, TimingConfig
from tunecache.tuner.measure.baseline import baseline_is_noisy, measure_baseline

# A schedule is a dozen small fields; anything much larger is not one (and a deeply nested
# document would only exhaust the JSON parser).
MAX_SCHEDULE_BYTES = 64 * 1024


@click.command("hw")
@hardware_option
@json_option
def hw_command(hardware: Path | None, as_json: bool) -> None:
    """Show the hardware spec kernels are tuned for (detected, or pinned)."""
    spec = local_spec(hardware)
    if as_json:
        click.echo(spec.to_json())
        return
    rows = [
        ("hw_id", spec.hw_id),
        ("cpu", spec.cpu_model),
        ("arch / isa", f"{spec.arch} / {spec.isa} ({spec.vector_bits}-bit, {spec.lanes} fp32 lanes)"),
        ("cores", str(spec.cores)),
        ("L1d", f"{spec.l1d_bytes >> 10} KiB, {spec.l1d_ways}-way"),
        ("L2", f"{spec.l2_bytes >> 10} KiB, {spec.l2_ways}-way"),
        ("L3", f"{spec.l3_bytes >> 20} MiB, {spec.l3_ways}-way, shared by {spec.l3_shared_by}"),
        ("cache line", f"{spec.cache_line} B"),
        ("features", ", ".join(spec.features) or "none"),
    ]
    for key, value in rows:
        click.echo(f"{key:<11} {value}")


def _result_row(result: MeasureResult) -> dict[str, Any]:
    return {
        "status": result.status,
        "error": result.error,
        "gflops": result.gflops,
        "median_ms": result.median_s * 1e3 if result.median_s else None,
        "min_ms": result.min_s * 1e3 if result.min_s else None,
        "repeats": len(result.runtimes_s),
    }


@click.command("bench-op")
@click.argument("op_text", metavar="OP")
@click.option("--schedule", "schedule_text", default=None,
              help="Schedule as JSON, or @FILE; default: a hand-picked BLIS-style schedule.")
@threads_option_with("Threads for the kernel and for numpy (default: the schedule's, else 1).")
@click.option("--min-time", type=click.FloatRange(min=0.0), default=0.3, show_default=True,
              help="Seconds of timed calls per measurement.")
@no_baseline_option
@click.option("--record/--no-record", default=True, show_default=True,
              help="Append the measurement to the store.")
@root_option
@hardware_option
@json_option
def bench_op_command(op_text: str, schedule_text: str | None, threads: int | None,
                     min_time: float, no_baseline: bool, record: bool, root: str | None,
                     hardware: Path | None, as_json: bool) -> None:
    """Build, check and time one kernel for OP, beside numpy on the same shape.

    OP is an op's text form, e.g. "matmul(M=512,N=768,K=768,layout=nn,epilogue=bias+relu)".
    """
    spec = local_spec(hardware)
    op = OpSignature.parse(op_text)
    if schedule_text:
        schedule = schedule_from_json(_schedule_json(schedule_text))
        if threads is not None:
            schedule = schedule.replace(threads=threads)
    else:
        schedule = default_schedule(op, spec, threads or 1)
    validate(op, schedule, spec)
    threads = schedule.threads
    timing = TimingConfig(min_time_s=min_time)
    with Runner(spec, timing) as runner:
        if not as_json:
            click.echo(f"building and timing {op.text} ...", err=True)
        result = runner.measure([Candidate(op, schedule)])[0]
        baseline = None if no_baseline else measure_baseline(op, threads, runner)
    stored = None
    if record:
        from tunecache.cache.store import Store
        from tunecache.tuner.measure.records import to_records

        store = Store(root)
        store.append(to_records([result], spec, job_id=f"bench-op-{uuid.uuid4().hex[:12]}"))
        stored = store.root
    report: dict[str, Any] = {
        "op": op.text,
        "op_id": op.op_id,
        "hw_id": spec.hw_id,
        "threads": threads,
        "schedule": schedule.to_dict(),
        "kernel": _result_row(result),
        "recorded_in": stored,
    }
    report["baseline_noisy"] = baseline is not None and baseline_is_noisy(baseline, timing)
    for name in BASELINES:
        ours = baseline is not None and baseline.source == name
        report[name] = _result_row(baseline) if ours and baseline else None
        report[f"ratio_to_{name}"] = (
            result.gflops / baseline.gflops
            if ours and baseline and result.gflops and baseline.gflops else None)
    if as_json:
        emit_json(report)
    else:
        _print_bench(report, spec)
    if not result.ok:
        raise SystemExit(1)


BASELINES = ("numpy", "onnxruntime")


def _schedule_json(option: str) -> str:
    """The JSON text of ``--schedule`` (inline, or ``@FILE``), at most MAX_SCHEDULE_BYTES."""
    if option.startswith("@"):
        where = option[1:]
        try:
            with os.fdopen(open_regular(where, follow_links=True), "rb") as handle:
                data = handle.read(MAX_SCHEDULE_BYTES + 1)
        except OSError as exc:
            raise click.BadParameter(f"cannot read {where}: {exc.strerror}",
                                     param_hint="--schedule") from None
    else:
        where, data = "the schedule JSON", option.encode(errors="replace")
    if len(data) > MAX_SCHEDULE_BYTES:
        raise click.BadParameter(f"{where} is larger than a schedule can be "
                                 f"({MAX_SCHEDULE_BYTES // 1024} KiB)", param_hint="--schedule")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise click.BadParameter(f"{where} is not UTF-8 text", param_hint="--schedule") from None


def _print_bench(report: dict[str, Any], spec: HardwareSpec) -> None:
    click.echo(f"op        {report['op']}")
    click.echo(f"hardware  {spec.hw_id} ({spec.isa}), {report['threads']} thread(s)")
    click.echo(f"schedule  {json.dumps(report['schedule'], sort_keys=True)}")
    for name in ("kernel", *BASELINES):
        row = report[name]
        if row is None:
            continue
        if row["status"] != "ok":
            click.echo(f"{name:<9} {row['status']}: {row['error']}")
            continue
        click.echo(
            f"{name:<9} {row['gflops']:8.2f} GFLOP/s   median {row['median_ms']:.4f} ms   "
            f"min {row['min_ms']:.4f} ms   ({row['repeats']} repeats)"
        )
    noisy = " (baseline timing noisy: median far above min; take with care)" \
        if report["baseline_noisy"] else ""
    if report["ratio_to_numpy"] is not None:
        click.echo(f"ratio     {report['ratio_to_numpy']:.3f}x numpy{noisy}")
    if report["ratio_to_onnxruntime"] is not None:
        click.echo(f"ratio     {report['ratio_to_onnxruntime']:.3f}x onnxruntime{noisy}")
    if report["recorded_in"]:
        click.echo(f"recorded  in the store at {report['recorded_in']}")


COMMANDS: list[click.Command] = [hw_command, bench_op_command]


def _no_legal_schedule(op: OpSignature, spec: HardwareSpec) -> str:
    """Why the tiler proposed nothing: the problems of the kind's default schedule."""
    try:
        why = "; ".join(problems(op, default_schedule(op, spec, spec.cores), spec))
    except ValueError as exc:
        why = str(exc)
    return f"no legal schedule for {op.text} on {spec.hw_id}: {why or 'none found'}"


@click.command("candidates")
@click.argument("op_text", metavar="OP")
@click.option("--k", "k", type=click.IntRange(min=1), default=10, show_default=True,
              help="How many candidates.")
@threads_option
@hardware_option
@json_option
def candidates_command(op_text: str, k: int, threads: int | None, hardware: Path | None,
                       as_json: bool) -> None:
    """Print the analytical tiler's top-k schedules for OP with their estimates."""
    from tunecache.tuner.search import timed_candidates

    spec = local_spec(hardware)
    op = OpSignature.parse(op_text)
    found, seconds = timed_candidates(op, spec, k, threads)
    if not found:
        raise click.ClickException(_no_legal_schedule(op, spec))
    if as_json:
        emit_json({
            "op": op.text, "op_id": op.op_id, "hw_id": spec.hw_id,
            "generation_ms": seconds * 1e3,
            "candidates": [
                {"rank": c.rank, "schedule": c.schedule.to_dict(),
                 "schedule_id": c.schedule.schedule_id, "estimated_ms": c.estimate.ms,
                 "estimated_gflops": c.estimate.gflops} for c in found
            ],
        })
        return
    click.echo(f"{op.text} on {spec.hw_id} ({spec.isa}, {spec.cores} cores): "
               f"{len(found)} candidates in {seconds * 1e3:.1f} ms")
    click.echo(f"{'rank':>4}  {'est. ms':>9}  {'est. GFLOP/s':>12}  schedule")
    for c in found:
        click.echo(f"{c.rank:>4}  {c.estimate.ms:>9.4f}  {c.estimate.gflops:>12.1f}  {c.schedule}")


COMMANDS.append(candidates_command)
