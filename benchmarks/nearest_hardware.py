"""Nearest-hardware serving: a compiled model's latency when its machine's records are gone.

For each model (ResNet-50 and MobileNet-v2 at 224x224, a BERT-base encoder layer at sequence
128, batch 1, random weights), a tuning job measures its kernel ops twice on this machine:
once as this machine's spec (every core) and once as a **neighbour** spec, the same machine
declared with one core (``--neighbour-cores``; a distinct ``hw_id``, the nearest tuned
hardware a fresh VM of another size would find). Then the model is compiled three ways and
timed back to back, in interleaved rounds:

* **exact** — the store holds both hardware: every op is an exact hit;
* **nearest** — this machine's records removed: every op is served from the neighbour and
  re-fitted to this machine's cores by the policy;
* **analytic** — an empty store: the tiler's top-1 for every op.

It also reports, for the ops, the neighbour's schedule against the exact one as the kernel
latency ratio measured by the tuning jobs. Cost model off (``use_model=False``) so only the
served schedules differ. The exact and neighbour records are kept in ``--keep`` for the seed.

    python benchmarks/nearest_hardware.py [--trials 4] [--rounds 5] [--keep DIR] [--no-write]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _report import git_revision, machine_summary, write_section
from onnx_support import bert_layer_model, mobilenet_v2_model, random_feeds, resnet50_model

from tunecache.cache.store import Store
from tunecache.compiler.frontend import kernel_ops
from tunecache.compiler.hardware import HardwareSpec, hardware_distance, local_spec
from tunecache.datasets.suites import Workload
from tunecache.tuner.deploy import CompiledModel, compile_model
from tunecache.tuner.jobs import JobOptions, run_job

MODELS = {
    "resnet50": ("ResNet-50 (224x224)", lambda: resnet50_model(1, 224)),
    "mobilenet_v2": ("MobileNet-v2 (224x224)", lambda: mobilenet_v2_model(224)),
    "bert": ("BERT-base layer (seq 128)",
             lambda: bert_layer_model(17, True, batch=1, seq=128, hidden=768, heads=12)),
}


def tune(path: Path, store: Store, hw: HardwareSpec, trials: int) -> float:
    start = time.perf_counter()
    ops = kernel_ops(path)
    run_job([Workload(op, count, label) for op, count, label in ops], hw, store,
            JobOptions(trials=trials, refine=False, baseline=False,
                       job_id=f"nearest-{hw.hw_id}"))
    return time.perf_counter() - start


def interleaved_ms(models: dict[str, CompiledModel], feeds: dict, rounds: int,
                   per_round: int) -> dict[str, float]:
    """Median milliseconds per model, timed in alternating rounds (noise hits all alike)."""
    samples: dict[str, list[float]] = {k: [] for k in models}
    for compiled in models.values():
        compiled.run(feeds)
    for _ in range(rounds):
        for key, compiled in models.items():
            for _ in range(per_round):
                start = time.perf_counter()
                compiled.run(feeds)
                samples[key].append(time.perf_counter() - start)
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}


def served(compiled: CompiledModel, kind: str) -> int:
    return sum((e.served_from or {}).get("kind") == kind for e in compiled.plan)


def one_model(key: str, work: Path, hw: HardwareSpec, neighbour: HardwareSpec,
              args: argparse.Namespace) -> dict[str, object]:
    label, build = MODELS[key]
    model = build()
    path = work / f"{key}.onnx"
    onnx.save(model, path)
    both = Store(work / f"both-{key}")
    tune_exact = tune(path, both, hw, args.trials)
    tune_near = tune(path, both, neighbour, args.trials)
    both.publish()
    only_neighbour = Store(work / f"neighbour-{key}")
    only_neighbour.append(both.load(hw_id=neighbour.hw_id))
    only_neighbour.publish()
    common = {"policy": "balanced", "use_model": False, "record_wanted": False}
    compiled = {
        "exact": compile_model(path, store=both, **common),
        "nearest": compile_model(path, store=only_neighbour, **common),
        "analytic": compile_model(path, store=Store(work / "empty"), policy="analytic",
                                  record_wanted=False),
    }
    ms = interleaved_ms(compiled, random_feeds(model), args.rounds, args.per_round)
    if args.keep:
        Store(args.keep).append(both.load())
    row = {"model": label, "nodes": len(compiled["exact"].plan),
           "exact_hits": served(compiled["exact"], "exact"),
           "nearest_served": served(compiled["nearest"], "nearest"),
           "tune_exact_s": tune_exact, "tune_neighbour_s": tune_near, **{f"{k}_ms": v for k, v in ms.items()}}
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=4)
    parser.add_argument("--neighbour-cores", type=int, default=1)
    parser.add_argument("--only", choices=sorted(MODELS), action="append", default=None)
    parser.add_argument("--keep", type=Path, default=None, help="store to add the records to")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    os.environ["TUNECACHE_SEED"] = "off"  # only this run's stores serve
    hw = local_spec()
    neighbour = dataclasses.replace(hw, cores=args.neighbour_cores)
    distance = hardware_distance(hw, neighbour)
    work = Path(tempfile.mkdtemp(prefix="nearest-hw-"))
    try:
        rows = [one_model(k, work, hw, neighbour, args) for k in (args.only or list(MODELS))]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [machine_summary(), "",
             f"Revision `{git_revision()}`. Neighbour: this machine declared with "
             f"{neighbour.cores} core(s), `{neighbour.hw_id}`, distance {distance:.2f}. Each "
             f"model's kernel ops tuned with `--trials {args.trials}` (no refinement) for both "
             f"specs; compiled with the balanced policy, cost model off; medians of "
             f"{args.rounds} interleaved rounds x {args.per_round} runs, {hw.cores} threads.",
             "",
             "| model | kernel nodes | exact: hits | exact | nearest: served | nearest | "
             "**nearest ÷ exact** | analytic | analytic ÷ exact |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['nodes']} | {r['exact_hits']} | {r['exact_ms']:.2f} ms | "
            f"{r['nearest_served']} | {r['nearest_ms']:.2f} ms | "
            f"**{r['nearest_ms'] / r['exact_ms']:.3f}** | {r['analytic_ms']:.2f} ms | "
            f"{r['analytic_ms'] / r['exact_ms']:.3f} |")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(text)


if __name__ == "__main__":
    main()
