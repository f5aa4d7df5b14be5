"""tunecache's tuned kernels against Apache TVM MetaSchedule's, single thread, float32, batch 1.

Operators: a BERT-base projection matmul, a square 1024³ matmul, a ResNet-50 3x3 conv, a
MobileNet-v2 1x1 projection conv and a MobileNet-v2 depthwise 3x3 conv. Each is written once
as an ``OpSignature``; TVM gets the same computation as a TE ``te.compute`` in NCHW/OIHW
(matmul: ``A[M,K] @ B[K,N]``), weights passed as plain inputs on both sides (no weight
pre-packing by either: our conv timing repacks OIHW weights inside every call, and no TVM
buffer is marked layout-free).

TVM: one ``tune_tir`` run per op to the largest ``--tvm-trials`` count (default XGBoost cost
model, evolutionary search, 64 trials per batch, default timing); a measure callback records,
after every batch, the wall time since tuning started and the best candidate so far, so a
checkpoint at N trials is the best of the first N measured, with the wall time at the end of
the batch holding trial N (what a run with ``max_trials_global=N`` would have done: the search
does not depend on the budget). tunecache: one cold ``tune_op`` run per ``--tc-trials`` budget
(the tiler's ranking, no cost model, refinement on; fresh build cache each), wall time from
start to result.

At the end, the best kernel of every checkpoint on both sides is re-timed in this process,
interleaved (ours in the tuner's worker process; TVM's with ``time_evaluator``, median of
repeats), ``--rounds`` times; the figure is the median over rounds. Every kernel runs on one
thread: TVM_NUM_THREADS=1 and OMP_NUM_THREADS=1 are set before any import, the TVM target has
``num-cores`` 1, our schedules are restricted to one thread.

Needs TVM (not in the project's default environment)::

    python -m venv tvmvenv && tvmvenv/bin/pip install -e '.[tvm,plots]'
    tvmvenv/bin/python benchmarks/tvm_metaschedule.py [--tvm-trials 64,256,1000] \\
        [--tc-trials 4,10,30] [--only matmul_bert] [--no-write]

A thousand MetaSchedule trials take 10-60 minutes per operator on a 2-core VM, so the
operators can be run one per invocation (``--only NAME --json NAME.json --no-write``) and
reported together (``--merge A.json --merge B.json``): each operator's ratios come from
kernels re-timed back to back in its own run, and a file from another machine is refused.
``--tvm-cache DIR`` keeps each MetaSchedule run's checkpoints (the scheduled modules in TVM's
own JSON IR format, with the trial counts and wall times of the run that found them) and
reuses them when the operator, budgets, target, TVM version and machine match, so that a
change on our side is measured against the same TVM kernels without tuning TVM again.
``--section NAME`` writes another block of this script's docs/BENCHMARKS.md section (and
docs/NAME.png), one per machine: ``tvm_metaschedule`` holds the AVX-512 VM's run,
``tvm_metaschedule_avx2`` the AVX2 VM's.
"""

from __future__ import annotations

import os

# Before numpy or TVM start their thread pools.
os.environ["TVM_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.matmul import matmul_op

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_revision, machine_summary, write_section

from tunecache.compiler.hardware import HardwareSpec, local_spec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import random_inputs, reference, tolerance
from tunecache.compiler.schedule import Schedule
from tunecache.tuner.measure import Candidate, Runner, TimingConfig
from tunecache.tuner.search import TuneConfig, tune_op

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
INSTALL_HINT = ("TVM is not importable in this Python; install it into a separate venv: "
                "`python -m venv tvmvenv && tvmvenv/bin/pip install -e '.[tvm,plots]'` "
                "and run this script with tvmvenv/bin/python")

OPS: dict[str, tuple[str, OpSignature]] = {
    "matmul_bert": ("BERT-base projection", matmul_op(128, 768, 768)),
    "matmul_1024": ("square", matmul_op(1024, 1024, 1024)),
    "conv_resnet50_3x3": ("ResNet-50 stage 1, 3x3",
                          conv2d_op(1, 64, 56, 56, 64, 3, 3, pads=1)),
    "conv_mobilenet_1x1": ("MobileNet-v2 project, 1x1",
                           conv2d_op(1, 144, 56, 56, 24, 1, 1)),
    "dwconv_mobilenet_3x3": ("MobileNet-v2 depthwise 3x3",
                             conv2d_op(1, 144, 56, 56, 144, 3, 3, pads=1, groups=144)),
}


@dataclass(frozen=True)
class Checkpoint:
    """The best kernel one tuner had after ``trials`` measurements and ``wall_s`` seconds.

    ``kernel`` is TVM's scheduled IRModule or our ``Schedule``; ``tuned_s`` the latency the
    tuner itself measured; ``budget`` the trial count asked for."""

    tuner: str
    budget: int
    trials: int
    wall_s: float
    tuned_s: float | None
    kernel: Any


@dataclass
class Retimed:
    """A checkpoint with its latencies from the final interleaved re-timing."""

    point: Checkpoint
    samples_s: list[float] = field(default_factory=list)
    error: str | None = None
    revision: str | None = None  # set when the row comes from an earlier run (--merge)

    @property
    def latency_s(self) -> float | None:
        return statistics.median(self.samples_s) if self.samples_s and not self.error else None


@dataclass(frozen=True)
class TvmModules:
    tvm: Any
    te: Any
    tirx: Any
    ms: Any
    derived_object: Any


def load_tvm() -> TvmModules | str:
    """TVM's modules, or why they cannot be imported."""
    try:
        import tvm  # type: ignore[import-not-found]
        from tvm import te, tirx  # type: ignore[import-not-found]
        from tvm.ir.utils import derived_object  # type: ignore[import-not-found]
        from tvm.s_tir import meta_schedule as ms  # type: ignore[import-not-found]
    except ImportError as exc:
        return f"{exc}. {INSTALL_HINT}"
    return TvmModules(tvm, te, tirx, ms, derived_object)


# -- TVM side -----------------------------------------------------------------------------


def te_workload(op: OpSignature, t: TvmModules) -> list[Any]:
    """``op`` as TE tensors ``[inputs..., output]``: matmul ``nn`` or an NCHW/OIHW conv2d."""
    te, tirx = t.te, t.tirx
    d = op.dims_dict
    if op.kind == "matmul":
        a = te.placeholder((d["M"], d["K"]), "float32", name="A")
        b = te.placeholder((d["K"], d["N"]), "float32", name="B")
        k = te.reduce_axis((0, d["K"]), name="k")
        c = te.compute((d["M"], d["N"]), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
        return [a, b, c]
    n, c_in, h, w, f, r, s, g = (d[x] for x in ("N", "C", "H", "W", "F", "R", "S", "groups"))
    pt, pl, pb, pr = d["pad_t"], d["pad_l"], d["pad_b"], d["pad_r"]
    sh, sw, dh, dw = d["stride_h"], d["stride_w"], d["dil_h"], d["dil_w"]
    x = te.placeholder((n, c_in, h, w), "float32", name="X")
    wt = te.placeholder((f, c_in // g, r, s), "float32", name="W")
    xp = x
    if pt or pl or pb or pr:
        xp = te.compute(
            (n, c_in, h + pt + pb, w + pl + pr),
            lambda i, c, y, z: tirx.if_then_else(
                tirx.all(y >= pt, y < h + pt, z >= pl, z < w + pl),
                x[i, c, y - pt, z - pl], tirx.const(0.0, "float32")),
            name="pad")
    cg, fg = c_in // g, f // g
    ry = te.reduce_axis((0, r), name="ry")
    rx = te.reduce_axis((0, s), name="rx")
    if cg == 1:  # depthwise (times a channel multiplier): no channel reduction
        y = te.compute(
            (n, f, op.out_h, op.out_w),
            lambda i, o, p, q: te.sum(
                xp[i, o // fg, p * sh + ry * dh, q * sw + rx * dw] * wt[o, 0, ry, rx],
                axis=[ry, rx]),
            name="Y")
        return [x, wt, y]
    rc = te.reduce_axis((0, cg), name="rc")

    def channel(o: Any, c: Any) -> Any:
        return c if g == 1 else o // fg * cg + c

    y = te.compute(
        (n, f, op.out_h, op.out_w),
        lambda i, o, p, q: te.sum(
            xp[i, channel(o, rc), p * sh + ry * dh, q * sw + rx * dw] * wt[o, rc, ry, rx],
            axis=[rc, ry, rx]),
        name="Y")
    return [x, wt, y]


def tvm_target(t: TvmModules) -> Any:
    from tvm.target import codegen  # type: ignore[import-not-found]

    return t.tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu(),
                                "num-cores": 1})


def _cache_key(op: OpSignature, budgets: list[int], t: TvmModules, target: Any,
               seed: int, hw: HardwareSpec) -> dict[str, Any]:
    return {"hw_id": hw.hw_id, "op": op.text, "budgets": sorted(set(budgets)),
            "target": str(target), "tvm": t.tvm.__version__, "seed": seed}


def cached_tvm(path: Path, key: dict[str, Any], t: TvmModules) -> list[Checkpoint] | None:
    """Checkpoints saved by :func:`save_tvm` under the same key, else None."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("key") != key:
        return None
    return [Checkpoint("TVM MetaSchedule", p["budget"], p["trials"], p["wall_s"], p["tuned_s"],
                       t.tvm.ir.load_json(p["mod"]) if p["mod"] else None)
            for p in data["points"]]


def save_tvm(path: Path, key: dict[str, Any], points: list[Checkpoint], t: TvmModules) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "points": [
        {"budget": p.budget, "trials": p.trials, "wall_s": p.wall_s, "tuned_s": p.tuned_s,
         "mod": t.tvm.ir.save_json(p.kernel) if p.kernel is not None else None}
        for p in points]}))


def tune_tvm(op: OpSignature, name: str, budgets: list[int], t: TvmModules, target: Any,
             build_timeout_s: float, seed: int) -> list[Checkpoint]:
    """One MetaSchedule run to ``max(budgets)`` trials; the best so far at every budget."""
    ms = t.ms
    func = t.te.create_prim_func(te_workload(op, t))
    wanted = sorted(set(budgets))
    points: list[Checkpoint] = []
    state: dict[str, Any] = {"count": 0, "best_s": None, "best_mod": None}
    start = time.perf_counter()

    @t.derived_object
    class Record(ms.measure_callback.PyMeasureCallback):  # type: ignore[misc]
        def apply(self, task_scheduler: Any, task_id: int, candidates: Any, builds: Any,
                  runs: Any) -> None:
            now = time.perf_counter() - start
            for cand, built, ran in zip(candidates, builds, runs, strict=True):
                state["count"] += 1
                if built.error_msg is None and ran.error_msg is None and ran.run_secs:
                    secs = float(np.median([float(v) for v in ran.run_secs]))
                    if state["best_s"] is None or secs < state["best_s"]:
                        state["best_s"], state["best_mod"] = secs, cand.sch.mod
                while len(points) < len(wanted) and state["count"] >= wanted[len(points)]:
                    points.append(Checkpoint("TVM MetaSchedule", wanted[len(points)],
                                             state["count"], now, state["best_s"],
                                             state["best_mod"]))
            best = f"{state['best_s'] * 1e3:.3f} ms" if state["best_s"] else "none yet"
            print(f"[tvm {name}] {state['count']}/{wanted[-1]} trials, {now:.0f} s, "
                  f"best {best}", file=sys.stderr, flush=True)

    callbacks = [*ms.MeasureCallback.create("default"), Record()]
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="tvm-metaschedule-") as work_dir:
        ms.tune_tir(
            func, target, work_dir, max_trials_global=wanted[-1],
            num_trials_per_iter=min(64, wanted[-1]),
            builder=ms.builder.LocalBuilder(max_workers=cores, timeout_sec=build_timeout_s),
            runner=ms.runner.LocalRunner(timeout_sec=build_timeout_s),
            measure_callbacks=callbacks, num_tuning_cores=cores, seed=seed)
    wall = time.perf_counter() - start
    # The search may stop early (space exhausted): later budgets get what it had.
    for budget in wanted[len(points):]:
        points.append(Checkpoint("TVM MetaSchedule", budget, state["count"], wall,
                                 state["best_s"], state["best_mod"]))
    return points


class TvmKernel:
    """A checkpoint's scheduled module, built once, checked, and timed with time_evaluator."""

    def __init__(self, op: OpSignature, mod: Any, t: TvmModules, target: Any) -> None:
        import tvm.s_tir.tensor_intrin  # type: ignore[import-not-found]  # noqa: F401
        from tvm.driver import build  # type: ignore[import-not-found]
        from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock  # type: ignore[import-not-found]

        # What MetaSchedule's builder does to a candidate.
        self.lib = build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod),
                         target=target)
        self.t, self.dev, self.inputs = t, t.tvm.cpu(), random_inputs(op)
        expected = reference(op, self.inputs)
        args = self._args(expected.shape)
        self.lib["main"](*args)
        rtol, atol = tolerance(op, self.inputs)
        got = args[-1].numpy()
        if not np.allclose(got, expected, rtol=rtol, atol=atol):
            raise ValueError(f"wrong result (max abs err {np.max(np.abs(got - expected)):.2e})")
        self.out_shape = expected.shape

    def _args(self, out_shape: tuple[int, ...]) -> list[Any]:
        rt = self.t.tvm.runtime
        args = [rt.tensor(np.ascontiguousarray(x), self.dev) for x in self.inputs]
        return [*args, rt.empty(out_shape, "float32", self.dev)]

    def time_s(self, repeat: int, min_repeat_ms: int) -> float:
        """Median of ``repeat`` timings on freshly allocated buffers: the same module timed on
        two allocations differed by 10% here (placement), so each round draws new ones."""
        evaluator = self.lib.time_evaluator("main", self.dev, number=1, repeat=repeat,
                                            min_repeat_ms=min_repeat_ms)
        return float(np.median(evaluator(*self._args(self.out_shape)).results))


# -- tunecache side -----------------------------------------------------------------------


def tune_ours(op: OpSignature, name: str, budgets: list[int], hw: HardwareSpec,
              timing: TimingConfig) -> list[Checkpoint]:
    """One cold ``tune_op`` run per budget (fresh build cache, fresh runner)."""
    points = []
    for budget in sorted(set(budgets)):
        os.environ["TUNECACHE_BUILD_CACHE"] = tempfile.mkdtemp(prefix="tvm-bench-ours-")
        start = time.perf_counter()
        with Runner(hw, timing) as runner:
            result = tune_op(op, hw, runner, config=TuneConfig(trials=budget, threads=1))
        wall = time.perf_counter() - start
        best = result.best
        if result.error:
            print(f"[tunecache {name}] {result.error}", file=sys.stderr)
        points.append(Checkpoint("tunecache", budget, result.trials, wall,
                                 best.median_s if best else None,
                                 best.schedule if best else None))
        print(f"[tunecache {name}] budget {budget}: {result.trials} measured, {wall:.0f} s, "
              f"best {best.median_s * 1e3 if best and best.median_s else float('nan'):.3f} ms",
              file=sys.stderr, flush=True)
    return points


# -- re-timing both, interleaved ---------------------------------------------------------


def retime(op: OpSignature, points: list[Checkpoint], hw: HardwareSpec, t: TvmModules,
           target: Any, args: argparse.Namespace) -> list[Retimed]:
    os.environ["TUNECACHE_BUILD_CACHE"] = tempfile.mkdtemp(prefix="tvm-bench-retime-")
    out = [Retimed(p) for p in points]
    tvm_kernels: dict[int, TvmKernel] = {}
    for i, r in enumerate(out):
        if r.point.kernel is None:
            r.error = "no kernel"
        elif r.point.tuner != "tunecache":
            try:
                tvm_kernels[i] = TvmKernel(op, r.point.kernel, t, target)
            except Exception as exc:  # a TVM build or check failure is a result here
                r.error = f"{type(exc).__name__}: {exc}"
    timing = TimingConfig(min_time_s=args.min_time, min_repeats=10, prepacked_weights=False)
    with Runner(hw, timing) as runner:
        for _ in range(args.rounds):
            for i, r in enumerate(out):
                if r.error:
                    continue
                if i in tvm_kernels:
                    r.samples_s.append(tvm_kernels[i].time_s(10, int(args.min_time * 100)))
                    continue
                schedule: Schedule = r.point.kernel
                (m,) = runner.measure([Candidate(op, schedule, "retime")])
                if m.ok and m.median_s:
                    r.samples_s.append(m.median_s)
                else:
                    r.error = f"{m.status}: {m.error}"
    return out


# -- report -------------------------------------------------------------------------------


def render_op(name: str, label: str, op: OpSignature, rows: list[Retimed]) -> str:
    tvm_rows = [r for r in rows if r.point.tuner != "tunecache"]
    ref = max(tvm_rows, key=lambda r: r.point.budget) if tvm_rows else None
    ref_lat = ref.latency_s if ref else None
    earlier = {r.revision for r in rows if r.revision}
    run_at = f"; run at revision `{', '.join(sorted(earlier))}`" if earlier else ""
    lines = [f"**{name}**: {label}, `{op.text}` ({op.flops / 1e9:.3f} GFLOP{run_at})", "",
             "| tuner | budget (trials measured) | tuning wall s | best latency ms | GFLOP/s | "
             "latency ÷ TVM best | TVM tuning time ÷ this |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        p, lat = r.point, r.latency_s
        ms_text = f"{lat * 1e3:.3f}" if lat else f"n/a ({r.error})"
        gflops = f"{op.flops / lat / 1e9:.1f}" if lat else "n/a"
        ratio = f"{lat / ref_lat:.2f}" if lat and ref_lat else "n/a"
        speed = f"{ref.point.wall_s / p.wall_s:.1f}x" if ref and p.wall_s else "n/a"
        lines.append(f"| {p.tuner} | {p.budget} ({p.trials}) | {p.wall_s:.1f} | {ms_text} | "
                     f"{gflops} | {ratio} | {speed} |")
    return "\n".join(lines)


def render(results: dict[str, list[Retimed]], args: argparse.Namespace, tvm_version: str,
           plot: str | None) -> str:
    parts = [
        machine_summary(), "",
        f"Revision `{git_revision()}`; Apache TVM {tvm_version}. One thread everywhere "
        "(TVM_NUM_THREADS=1, OMP_NUM_THREADS=1, TVM target `num-cores` 1, our schedules "
        "single-threaded), float32, batch 1, weights passed unpacked to both. TVM: one "
        f"MetaSchedule run per op to {max(args.tvm_trials)} trials (XGBoost cost model, "
        f"evolutionary search, {min(64, max(args.tvm_trials))} per batch), checkpoints = best "
        "of the first N measured, at the wall time of the batch holding trial N. tunecache: "
        "one cold `tune_op` run per budget (tiler ranking, no cost model, refinement adds up "
        "to 4 trials). Latencies: every checkpoint's best kernel re-timed here, interleaved, "
        f"{args.rounds} rounds, median (ours: the tuner's worker; TVM: `time_evaluator`, "
        f"median of 10). Ratios are against TVM at {max(args.tvm_trials)} trials.", "",
    ]
    if plot:
        parts += [f"![best latency against tuning time]({plot})", ""]
    for name, rows in results.items():
        label, op = OPS[name]
        parts += [render_op(name, label, op, rows), ""]
    return "\n".join(parts)


def plot_curves(results: dict[str, list[Retimed]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: pip install 'tunecache[plots]' for the PNG", file=sys.stderr)
        return False
    cols = min(3, len(results))
    rows_n = -(-len(results) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4 * cols, 3.4 * rows_n), squeeze=False)
    for ax in axes.flat[len(results):]:
        ax.set_visible(False)
    for ax, (name, rows) in zip(axes.flat, results.items(), strict=False):
        for tuner, style in (("TVM MetaSchedule", "o-"), ("tunecache", "s-")):
            pts = [(r.point.wall_s, r.latency_s * 1e3) for r in rows
                   if r.point.tuner == tuner and r.latency_s]
            if pts:
                ax.plot(*zip(*sorted(pts), strict=True), style, label=tuner)
        ax.set_xscale("log")
        ax.set_xlabel("tuning wall time (s)")
        ax.set_ylabel("best latency (ms)")
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def dump_rows(results: dict[str, list[Retimed]], hw: HardwareSpec) -> dict[str, Any]:
    """The raw rows as JSON-ready data, tagged with the machine they were measured on and
    each with its revision (a merged row keeps the one it was measured at)."""
    now = git_revision()
    return {"hw_id": hw.hw_id, "ops": {
        name: [{"tuner": r.point.tuner, "budget": r.point.budget, "trials": r.point.trials,
                "wall_s": r.point.wall_s, "tuned_s": r.point.tuned_s,
                "latency_s": r.latency_s, "samples_s": r.samples_s, "error": r.error,
                "revision": r.revision or now}
               for r in rows]
        for name, rows in results.items()}}


def load_rows(path: Path, hw: HardwareSpec) -> dict[str, list[Retimed]]:
    """An earlier run's rows (``dump_rows``); refused unless measured on this machine, since
    each op's ratios only hold between kernels timed back to back on one machine."""
    try:
        data = json.loads(path.read_text())
        if data.get("hw_id") != hw.hw_id:
            raise ValueError(f"measured on {data.get('hw_id')}, this machine is {hw.hw_id}")
        return {name: [Retimed(Checkpoint(row["tuner"], row["budget"], row["trials"],
                                          row["wall_s"], row["tuned_s"], None),
                               list(row["samples_s"]), row["error"], row["revision"])
                       for row in rows]
                for name, rows in data["ops"].items() if name in OPS}
    except KeyError as exc:
        print(f"error: --merge {path}: no field {exc}; expected a --json file of this "
              "benchmark", file=sys.stderr)
        sys.exit(2)
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        print(f"error: --merge {path}: {exc}", file=sys.stderr)
        sys.exit(2)


def tvm_points(op: OpSignature, name: str, args: argparse.Namespace, t: TvmModules,
               target: Any, hw: HardwareSpec) -> list[Checkpoint]:
    """MetaSchedule's checkpoints for ``op``: from ``--tvm-cache`` when it holds a matching
    run, else tuned now (and saved there)."""
    key = _cache_key(op, args.tvm_trials, t, target, args.seed, hw)
    path = args.tvm_cache / f"{name}.json" if args.tvm_cache else None
    cached = cached_tvm(path, key, t) if path else None
    if cached is not None:
        print(f"[tvm {name}] checkpoints reused from {path}", file=sys.stderr, flush=True)
        return cached
    points = tune_tvm(op, name, args.tvm_trials, t, target, args.build_timeout, args.seed)
    if path:
        try:
            save_tvm(path, key, points, t)
        except Exception as exc:  # a failed save must not lose the run's results
            print(f"[tvm {name}] not saved to {path}: {exc}", file=sys.stderr, flush=True)
    return points


def counts(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of counts: {text}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"counts must be positive: {text}")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tvm-trials", type=counts, default=[64, 256, 1000],
                        help="MetaSchedule trial counts (checkpoints of one run per op)")
    parser.add_argument("--tc-trials", type=counts, default=[4, 10, 30],
                        help="tunecache trials per op (one cold run each)")
    parser.add_argument("--only", action="append", choices=sorted(OPS), default=None,
                        help="only this op (repeatable)")
    parser.add_argument("--build-timeout", type=float, default=300.0,
                        help="MetaSchedule builder and runner timeout per batch, s")
    parser.add_argument("--min-time", type=float, default=0.5,
                        help="re-timing: seconds of timing per kernel per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tvm-cache", type=Path, default=None,
                        help="keep MetaSchedule's checkpoints here and reuse matching ones")
    parser.add_argument("--tvm-only", action="store_true",
                        help="only tune TVM into --tvm-cache (for a later run to reuse)")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw rows here")
    parser.add_argument("--merge", type=Path, action="append", default=[],
                        help="a --json file of an earlier run on this machine: its ops are "
                             "reported beside this run's (repeatable; ops run now win)")
    parser.add_argument("--section", default="tvm_metaschedule",
                        help="block of this script's BENCHMARKS.md section to write (one per "
                             "machine); the plot is docs/SECTION.png")
    parser.add_argument("--no-write", action="store_true",
                        help="print only: no docs/BENCHMARKS.md section, no PNG")
    args = parser.parse_args()
    if args.tvm_only and not args.tvm_cache:
        parser.error("--tvm-only needs --tvm-cache DIR to keep what it tunes")
    t = load_tvm()
    if isinstance(t, str):
        print(f"error: {t}", file=sys.stderr)
        sys.exit(1)
    # MetaSchedule logs every batch at INFO to stdout; its log files keep everything.
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    hw = local_spec()
    target = tvm_target(t)
    tuning = TimingConfig(prepacked_weights=False)
    results: dict[str, list[Retimed]] = {}
    for path in args.merge:
        results.update(load_rows(path, hw))
    for name in args.only or ([] if args.merge else list(OPS)):
        _, op = OPS[name]
        points = tvm_points(op, name, args, t, target, hw)
        if args.tvm_only:
            continue
        points += tune_ours(op, name, args.tc_trials, hw, tuning)
        results[name] = retime(op, points, hw, t, target, args)
        print(render_op(name, *OPS[name], results[name]), file=sys.stderr, flush=True)
    if args.tvm_only:
        return
    plot = DOCS / f"{args.section}.png"
    plotted = not args.no_write and plot_curves(results, plot)
    text = render(results, args, t.tvm.__version__, plot.name if plotted else None)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(dump_rows(results, hw), indent=2))
    if not args.no_write:
        write_section(text, args.section)


if __name__ == "__main__":
    main()
