"""``tunecache compile`` and ``tunecache run``: deploy-time compilation against the cache."""

from __future__ import annotations

import os
import statistics
import time
import warnings
import zipfile
from pathlib import Path
from typing import Any

import click
import numpy as np

from tunecache.cache.store import Store
from tunecache.compiler import frontend
from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.files import open_regular
from tunecache.compiler.hardware import local_spec, machine_cpus
from tunecache.compiler.native.profile import ProgramProfile
from tunecache.compiler.precision import PRECISIONS
from tunecache.tuner.cli.common import (
    emit_json,
    hardware_option,
    json_option,
    parse_duration,
    root_option,
    threads_option_with,
)
from tunecache.tuner.cli.shapes import (
    Inputs,
    InputShapeError,
    input_shape_option,
    open_inputs,
    parse_input_shapes,
    resolve_shapes,
)
from tunecache.tuner.deploy import POLICIES, CompiledModel, compile_model
from tunecache.tuner.deploy.compile import sample_inputs
from tunecache.tuner.deploy.package import load_compiled, save_compiled, saved_model
from tunecache.tuner.deploy.package_file import is_package


def _common(func: Any) -> Any:
    options = [
        click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path)),
        click.option("--policy", type=click.Choice(POLICIES), default="balanced",
                     show_default=True, help="What to do on a cache miss."),
        click.option("--expected-calls", type=click.IntRange(min=0), default=1000,
                     show_default=True, help="Calls the deployment expects (weighs tuning)."),
        click.option("--deadline", default=None, metavar="DURATION",
                     help="Compile-time budget for measuring misses (e.g. 30s)."),
        click.option("--precision", type=click.Choice(PRECISIONS), default="fp32",
                     show_default=True,
                     help="bf16: products with constant weights (MatMul, Gemm) in bf16 "
                          "with float32 accumulation, where the CPU has bf16 dot products; "
                          "the plan reports the error against fp32."),
        input_shape_option,
        root_option,
        hardware_option,
        json_option,
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _load_saved(model_path: Path, input_shapes: tuple[str, ...], hardware: Path | None,
                precision: str) -> CompiledModel:
    """A compiled model's package: its options were fixed when it was saved."""
    given = [name for name, value in (("--input-shape", input_shapes), ("--hardware", hardware),
                                      ("--precision", precision != "fp32")) if value]
    if given:
        raise click.UsageError(f"{', '.join(given)} cannot change a compiled model "
                               f"({model_path} was planned when it was saved); compile the "
                               ".onnx file again to change it")
    return load_compiled(model_path)


def _compile(model_path: Path, policy: str, expected_calls: int, deadline: str | None,
             input_shapes: tuple[str, ...], root: str | None, hardware: Path | None,
             precision: str, inputs: Inputs | None = None,
             threads: int | None = None) -> CompiledModel:
    if is_package(model_path):
        return _load_saved(model_path, input_shapes, hardware, precision)
    # Warnings (a store that cannot be read or written, …) become one `warning:` line each.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            flags = parse_input_shapes(input_shapes) or {}  # a malformed flag before the model
            source = frontend.read_model(model_path)
            shapes = resolve_shapes(frontend.inspect_model(source, check=False), flags,
                                     inputs)
            return compile_model(
                source, store=Store(root), policy=policy, expected_calls=expected_calls,
                deadline_s=parse_duration(deadline) if deadline else None,
                hw=local_spec(hardware), input_shapes=shapes, threads=threads,
                precision=precision)
        finally:
            for message in dict.fromkeys(" ".join(str(w.message).split()) for w in caught):
                click.echo(f"warning: {message}", err=True)


@click.command("compile")
@_common
@click.option("--save", "save_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, metavar="FILE",
              help="Also save the compiled model (plan, kernels, runtime) to FILE, which "
                   "`tunecache run FILE` runs on a machine with no C compiler.")
def compile_command(model_path: Path, policy: str, expected_calls: int, deadline: str | None,
                    precision: str, input_shapes: tuple[str, ...], root: str | None,
                    hardware: Path | None, as_json: bool, save_path: Path | None) -> None:
    """Compile an ONNX model against the cache and print the plan: per kernel node the op,
    the decision and why, the expected latency and where the schedule came from."""
    compiled = _compile(model_path, policy, expected_calls, deadline, input_shapes, root,
                        hardware, precision)
    saved = save_compiled(compiled, save_path) if save_path is not None else None
    if as_json:
        emit_json({**compiled.summary(), "saved": saved.to_dict() if saved else None})
        return
    click.echo(f"{compiled.graph.name or model_path.name} on {compiled.hw.hw_id}: "
               f"{len(compiled.plan)} kernel nodes, compiled in "
               f"{compiled.timings['total_s']:.2f} s (policy {policy})")
    if not _planned(compiled) and compiled.info is not None:
        click.echo("  no input shape planned: " + open_inputs(
            compiled.info, "each shape is planned on its first run; --input-shape")
            + " plans one now")
    for entry in compiled.plan:
        expected = f"{entry.expected_s * 1e3:.3f} ms" if entry.expected_s else "-"
        fused = "+".join(entry.fused) if len(entry.fused) > 1 else entry.node
        click.echo(f"  {fused}: {entry.op.text}")
        click.echo(f"      {entry.action:<8} {entry.source:<9} {expected:>12}  {entry.reason}")
    summary = compiled.summary()
    click.echo("decisions: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["actions"].items())))
    click.echo("schedules: " + ", ".join(f"{v} {k}" for k, v in sorted(
        summary["served"].items(), key=lambda kv: -kv[1])))
    _echo_precision(compiled)
    _echo_outside(summary["outside_kernels"])
    if saved is not None:
        click.echo(f"saved: {saved.path} ({saved.bytes / 1e6:.1f} MB, {saved.objects} "
                   f"artifact(s) for {saved.hw_id})")


def _echo_outside(nodes: list[dict[str, str]]) -> None:
    """One line per engine: the ops of the nodes that run outside generated kernels."""
    for engine in ("reference", "numpy"):
        ops: dict[str, int] = {}
        for node in nodes:
            if node["engine"] == engine:
                ops[node["op"]] = ops.get(node["op"], 0) + 1
        if ops:
            what = ("ONNX's reference implementation (slow)" if engine == "reference"
                    else "numpy or the runner's copies")
            click.echo(f"outside kernels, {what}: " + ", ".join(
                f"{op} x{n}" if n > 1 else op for op, n in sorted(ops.items()))
                + " (run --profile times them)")


def _echo_precision(compiled: CompiledModel) -> None:
    plan = compiled.precision
    if plan.requested == "fp32":
        return
    line = f"precision: {plan.used} for {plan.nodes} kernel node(s)"
    if compiled.accuracy is not None:
        line += (f", error against fp32 {compiled.accuracy['max_rel_to_range']:.2e} of the "
                 "outputs' range (random input)")
    click.echo(line + (f"; {plan.note}" if plan.note else ""))


def _planned(compiled: CompiledModel) -> bool:
    """Whether an input shape was planned at compile time (a dynamic model given none has
    only its interface)."""
    return all(d >= 0 for i in compiled.graph.inputs for d in i.shape)


def _random_inputs(compiled: CompiledModel, seed: int) -> dict[str, np.ndarray]:
    return sample_inputs(compiled.graph.inputs, seed)


def _load_inputs(path: Path) -> dict[str, np.ndarray]:
    try:
        with os.fdopen(open_regular(path, follow_links=True), "rb") as handle:
            data = np.load(handle, allow_pickle=False)
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("not an .npz archive of named arrays (np.savez)")
            with data:
                return {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise InputShapeError(f"cannot read inputs from {path}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None


PROFILE_TOP = 15
"""Slowest steps ``run --profile`` lists when given no count."""


def _time(fn: Any, repeat: int) -> list[float]:
    fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


@click.command("run")
@_common
@click.option("--inputs", "inputs_path", type=click.Path(path_type=Path), default=None,
              help="An .npz of named inputs (default: random, seeded).")
@click.option("--compare", type=click.Choice(["onnxruntime"]), default=None,
              help="Also run onnxruntime: max abs/rel error and the latency ratio.")
@click.option("--repeat", type=click.IntRange(min=1), default=20, show_default=True,
              help="Timed runs (median reported).")
@click.option("--profile", "profile_top", type=click.IntRange(min=0), default=None,
              is_flag=False, flag_value=PROFILE_TOP, metavar="[N]",
              help="Also time every step inside the native program and print where the "
                   f"time goes: by kind of step, by op, and the N slowest steps "
                   f"(default {PROFILE_TOP}); --json has every step.")
@threads_option_with("Threads for our kernels and for onnxruntime alike (default: every core).")
def run_command(model_path: Path, policy: str, expected_calls: int, deadline: str | None,
                precision: str, input_shapes: tuple[str, ...], root: str | None,
                hardware: Path | None, as_json: bool, inputs_path: Path | None,
                compare: str | None, repeat: int, profile_top: int | None,
                threads: int | None) -> None:
    """Compile and run an ONNX model (or run a compiled model saved by `compile --save`, with
    no compiler); with --compare onnxruntime, check and time it against onnxruntime on the
    same inputs and thread count; with --profile, say where its time goes."""
    if threads is not None and threads > machine_cpus():
        raise click.BadParameter(f"{threads} is more than this machine's {machine_cpus()} "
                                 "CPUs", param_hint="--threads")
    given = Inputs(inputs_path, _load_inputs(inputs_path)) if inputs_path else None
    package = is_package(model_path)
    compiled = _compile(model_path, policy, expected_calls, deadline, input_shapes, root,
                        hardware, precision, given, threads)
    if given is None and not _planned(compiled):
        assert compiled.info is not None
        raise InputShapeError(open_inputs(compiled.info))
    inputs = given.arrays if given else _random_inputs(compiled, 0)
    outputs = compiled.run(inputs)
    ours = _time(lambda: compiled.run(inputs), repeat)
    report: dict[str, Any] = {
        "model": str(model_path), "hw_id": compiled.hw.hw_id,
        "compile_s": compiled.timings["total_s"], "latency_ms": statistics.median(ours) * 1e3,
        "outputs": {k: list(v.shape) for k, v in outputs.items()},
        "shapes": [s.to_dict() for s in compiled.shape_stats()],
        "precision": compiled.precision.to_dict(),
    }
    if compiled.accuracy is not None:
        report["accuracy"] = compiled.accuracy
    if compare == "onnxruntime":
        onnx_model = saved_model(model_path) if package else str(model_path)
        report["onnxruntime"] = _compare_onnxruntime(
            onnx_model, inputs, outputs, min(threads or compiled.hw.cores, machine_cpus()),
            repeat)
        if "latency_ms" in report["onnxruntime"]:
            report["latency_ratio"] = (statistics.median(ours)
                                       / (report["onnxruntime"]["latency_ms"] / 1e3))
    profile = compiled.profile(inputs, repeat) if profile_top is not None else None
    if profile is not None:
        report["profile"] = profile.to_dict()
    if as_json:
        emit_json(report)
        return
    made = "loaded" if package else "compiled"
    click.echo(f"{model_path.name}: {made} in {report['compile_s']:.2f} s, latency "
               f"{report['latency_ms']:.3f} ms (median of {repeat})")
    _echo_precision(compiled)
    if compare and "refused" in report["onnxruntime"]:
        click.echo(f"onnxruntime refused the model: {report['onnxruntime']['refused']}")
    elif compare:
        ort_report = report["onnxruntime"]
        click.echo(f"onnxruntime ({ort_report['threads']} threads): "
                   f"{ort_report['latency_ms']:.3f} ms; ours / onnxruntime = "
                   f"{report['latency_ratio']:.2f}x")
        for name, err in ort_report["errors"].items():
            click.echo(f"  {name}: max abs error {err['max_abs']:.3g}, max rel error "
                       f"{err['max_rel']:.3g}")
    if profile is not None:
        _echo_profile(profile, profile_top or 0)


def _compare_onnxruntime(model: str | bytes, inputs: dict[str, np.ndarray],
                         outputs: dict[str, np.ndarray], threads: int, repeat: int
                         ) -> dict[str, Any]:
    """onnxruntime on the same model and inputs: its latency and our outputs' errors
    against its, or ``{"refused": why}`` (one line) where it will not run the model."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise TunecacheError("--compare onnxruntime needs onnxruntime: "
                             "pip install 'tunecache[onnxruntime]'") from None
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    try:
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        feed = {i.name: inputs[i.name] for i in session.get_inputs()}
        names = [o.name for o in session.get_outputs()]
        expected = dict(zip(names, session.run(names, feed), strict=True))
    except Exception as exc:  # onnxruntime's own exception types, one per failure kind
        return {"refused": " ".join(str(exc).split())[:400] or type(exc).__name__}
    theirs = _time(lambda: session.run(names, feed), repeat)
    errors = {}
    for name, value in outputs.items():
        ref = expected[name].astype(np.float64)
        diff = np.abs(value.astype(np.float64) - ref)
        errors[name] = {"max_abs": float(diff.max()) if diff.size else 0.0,
                        "max_rel": float((diff / np.maximum(np.abs(ref), 1e-6)).max())
                        if diff.size else 0.0}
    return {"latency_ms": statistics.median(theirs) * 1e3, "threads": threads,
            "errors": errors}


def _echo_profile(profile: ProgramProfile, top: int) -> None:
    run_ms = profile.run_seconds * 1e3

    def share(seconds: float) -> str:
        return f"{seconds * 1e3:9.3f} ms {100 * seconds * 1e3 / run_ms:5.1f}%" if run_ms \
            else f"{seconds * 1e3:9.3f} ms"

    click.echo(f"profile: a run took {run_ms:.3f} ms (median of {profile.runs})")
    for where, seconds in profile.seconds_by("where").items():
        click.echo(f"  {where:<10} {share(seconds)}")
    click.echo(f"  {'python':<10} {share(profile.outside_seconds)}  (between the steps)")
    click.echo("by op:")
    for op, seconds in profile.seconds_by("op").items():
        click.echo(f"  {op:<24} {share(seconds)}")
    if top:
        click.echo(f"slowest {min(top, len(profile.steps))} steps:")
        for step in profile.top(top):
            click.echo(f"  #{step.index:<4} {step.step.op:<16} {step.step.where:<6} "
                       f"{share(step.seconds)}  {step.step.node}")


COMMANDS: list[click.Command] = [compile_command, run_command]
