"""A nightly job on real model ops: what tuning buys, and how fast each search order gets there.

Part 1 runs the real job (`run_job`, as `tunecache tune` does) on the op set of one BERT-base
encoder layer and one ResNet-50 stage (layer1) into a fresh store: wall time, ops tuned,
trials per op, the speedup of the tuned kernel over the tiler's untuned top-1 (the first
candidate the job measured), and the ratio to numpy (matmul) / onnxruntime (conv2d) measured
in the same run.

Part 2 measures, per op, a pool of schedules (the tiler's top-30 plus a stratified sample of
the legal grid) and replays three search orders over it: tiler-ordered (analytic estimate),
model-ordered (a cost model trained on the committed fixture *without* these ops) and random
(mean of 20 permutations). The best-so-far curve (best so far ÷ best in pool) against trials
is plotted per op into docs/tune_model.png.

    python benchmarks/tune_model.py [--trials 10] [--pool 30] [--sample 30]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_revision, machine_summary, write_section

from tunecache.cache.store import Store
from tunecache.compiler.hardware import HardwareSpec, local_spec
from tunecache.compiler.ops import OpSignature
from tunecache.datasets.suites import SUITES, Workload
from tunecache.tuner.jobs import JobOptions, run_job
from tunecache.tuner.measure import Candidate, Runner, TimingConfig
from tunecache.tuner.search import roller

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "measurements.parquet"
RESNET_STAGE = (1, 2, 3, 4, 5)  # resnet50 suite entries of layer1


def workloads() -> list[Workload]:
    bert = list(SUITES["bert_layer"].workloads)
    resnet = [SUITES["resnet50"].workloads[i] for i in RESNET_STAGE]
    return bert + resnet


def train_model_without(ops: list[OpSignature]):  # type: ignore[no-untyped-def]
    """A cost model trained on the fixture minus these ops (None if unavailable)."""
    try:
        import pandas as pd

        from tunecache.costmodel.model import CostModel
    except ImportError:
        return None
    if not FIXTURE.exists():
        return None
    frame = pd.read_parquet(FIXTURE)
    held_out = {op.op_id for op in ops}
    frame = frame[~frame["op_id"].isin(held_out)]
    return CostModel.fit(frame)


def best_so_far(times: list[float], best: float) -> list[float]:
    out, cur = [], math.inf
    for t in times:
        cur = min(cur, t)
        out.append(best / cur if cur < math.inf else 0.0)
    return out


def replay(op: OpSignature, hw: HardwareSpec, runner: Runner, model, pool_k: int,  # type: ignore[no-untyped-def]
           sample: int) -> dict[str, list[float]] | None:
    top = roller.candidates(op, hw, k=pool_k)
    chosen = [c.schedule for c in top]
    extra = [s for s in roller.exhaustive_space(op, hw, limit=sample, seed=11) if s not in chosen]
    schedules = chosen + extra
    results = runner.measure([Candidate(op, s, "exhaustive") for s in schedules])
    times = [r.median_s if r.ok and r.median_s else math.inf for r in results]
    best = min(times)
    if best == math.inf:
        return None
    estimates = [roller.estimate(op, s, hw).seconds for s in schedules]
    tiler_order = sorted(range(len(schedules)), key=lambda i: estimates[i])
    curves = {"tiler": best_so_far([times[i] for i in tiler_order], best)}
    if model is not None:
        scores = list(model.predict(op, schedules, hw))
        model_order = sorted(range(len(schedules)), key=lambda i: -scores[i])
        curves["model"] = best_so_far([times[i] for i in model_order], best)
    rng = np.random.default_rng(0)
    random_curves = [best_so_far([times[i] for i in rng.permutation(len(times))], best)
                     for _ in range(20)]
    curves["random"] = [float(np.mean(col)) for col in zip(*random_curves, strict=True)]
    return curves


def plot(curves: dict[str, dict[str, list[float]]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: pip install 'tunecache[plots]' for the PNG", file=sys.stderr)
        return False
    names = list(curves)
    cols = 5
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for order, style in (("tiler", "-"), ("model", "--"), ("random", ":")):
            if order in curves[name]:
                ys = curves[name][order][:40]
                ax.plot(range(1, len(ys) + 1), ys, style, label=order)
        ax.set_title(name, fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.axhline(0.95, color="grey", linewidth=0.5)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.supxlabel("trials")
    fig.supylabel("best so far ÷ best in pool")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def trials_to(curve: list[float], reach: float = 0.95) -> int:
    return next((i + 1 for i, v in enumerate(curve) if v >= reach), len(curve) + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--pool", type=int, default=30)
    parser.add_argument("--sample", type=int, default=30)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    os.environ["TUNECACHE_BUILD_CACHE"] = tempfile.mkdtemp(prefix="tune-model-kernels-")
    hw = local_spec()
    work = workloads()
    store = Store(tempfile.mkdtemp(prefix="tune-model-store-"))

    start = time.monotonic()
    summary = run_job(work, hw, store, JobOptions(trials=args.trials, refine=True))
    wall = time.monotonic() - start
    frame = store.load()
    lines = [machine_summary(), "", f"Revision `{git_revision()}`. Part 1: `run_job` on a fresh "
             f"store, {len(work)} ops (one BERT-base encoder layer at sequence 128 and ResNet-50 "
             f"layer1 at 56×56, batch 1), `--trials {args.trials}` plus refinement, cold build "
             f"cache, threads = all cores. Wall time **{wall:.0f} s**, "
             f"{summary.trials} measurements.", "",
             "| op | status | trials | tuned GFLOP/s | tiler top-1 GFLOP/s | tuned ÷ top-1 | "
             "baseline | ratio | time |", "|---|---|---|---|---|---|---|---|---|"]
    speedups, ratios = [], []
    for item in summary.ops:
        rows = frame[(frame["op_id"] == item.op.op_id) & (frame["source"] == "tiler")]
        rows = rows.sort_values("timestamp")
        first = rows.iloc[0] if len(rows) else None
        top1 = float(first["gflops"]) if first is not None and first["status"] == "ok" else None
        speed = item.best_gflops / top1 if item.best_gflops and top1 else None
        if speed:
            speedups.append(speed)
        if item.ratio:
            ratios.append(item.ratio)
        lines.append(
            f"| `{item.op.text}` | {item.status} | {item.trials} | "
            f"{item.best_gflops or 0:.1f} | {top1 or 0:.1f} | "
            f"{f'{speed:.2f}x' if speed else 'n/a'} | "
            f"{f'{item.baseline} {item.baseline_gflops:.1f}' if item.baseline_gflops else 'n/a'} | "
            f"{f'{item.ratio:.2f}x' if item.ratio else 'n/a'} | {item.seconds:.1f} s |")
    lines += ["", f"- Tuned over the tiler's untuned top-1: median **{statistics.median(speedups):.2f}x**"
              f", max {max(speedups):.2f}x." if speedups else "- no speedups measured",
              f"- Tuned against the baseline (numpy for matmul, onnxruntime for conv2d, same "
              f"threads): median **{statistics.median(ratios):.2f}x**, min {min(ratios):.2f}x."
              if ratios else "- no baseline measured", ""]

    model = train_model_without([w.op for w in work])
    curves: dict[str, dict[str, list[float]]] = {}
    with Runner(hw, TimingConfig(min_time_s=0.05, min_repeats=5)) as runner:
        for w in work:
            got = replay(w.op, hw, runner, model, args.pool, args.sample)
            if got:
                name = w.label if len(w.label) < 40 else w.label[:37] + "..."
                curves[name] = got
                print(name, {k: trials_to(v) for k, v in got.items()}, flush=True)
    plotted = plot(curves, ROOT / "docs" / "tune_model.png")
    lines += [f"Part 2: per op a pool of the tiler's top-{args.pool} plus {args.sample} sampled "
              "schedules, all measured; search orders replayed over it. Trials to reach 0.95 of "
              "the pool's best (lower is better; random = mean of 20 orders; model = trained "
              "on the committed fixture without these ops"
              + ("" if model is not None else ", not available in this run") + "):", "",
              "| op | tiler-ordered | model-ordered | random |", "|---|---|---|---|"]
    for name, c in curves.items():
        lines.append(f"| {name} | {trials_to(c['tiler'])} | "
                     f"{trials_to(c['model']) if 'model' in c else 'n/a'} | "
                     f"{trials_to(c['random'])} |")
    if curves:
        med = {k: statistics.median(trials_to(c[k]) for c in curves.values() if k in c)
               for k in ("tiler", "model", "random") if any(k in c for c in curves.values())}
        lines.append("")
        lines.append("Median trials to 0.95: " + ", ".join(f"{k} {v:g}" for k, v in med.items())
                     + ".")
    if plotted:
        lines += ["", "![best-so-far curves per op](tune_model.png)"]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(text)


if __name__ == "__main__":
    main()
