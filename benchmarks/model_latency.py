"""End-to-end latency of compiled ONNX models against onnxruntime, and compile times.

For a ResNet-50 and a MobileNet-v2 (batch 1, 224x224, random weights; ReLU where
MobileNet-v2 has ReLU6, as the suites list it) and a BERT-base encoder layer (batch 1,
sequence 128, hidden 768, 12 heads): cold compile (empty build cache, analytic policy), warm
compile (everything built), a nightly tuning job on the model's kernel ops (``--trials``
per op) into a fresh store, then the compile against the tuned cache and the latency of
``CompiledModel.run`` against onnxruntime with the same thread count (medians over repeats,
measured one after the other in this process). The share of time spent in generated kernels
vs numpy ops shows where the time goes.

    python benchmarks/model_latency.py [--trials 6] [--repeat 20] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _report import git_revision, machine_summary, median_ms, write_section
from onnx_support import bert_layer_model, mobilenet_v2_model, random_feeds, resnet50_model

from tunecache.cache.store import Store
from tunecache.compiler.frontend import kernel_ops
from tunecache.compiler.hardware import local_spec
from tunecache.datasets.suites import Workload
from tunecache.tuner.deploy import CompiledModel, compile_model
from tunecache.tuner.jobs import JobOptions, run_job

ROOT = Path(__file__).resolve().parent.parent


def kernel_share(compiled: CompiledModel, feeds: dict[str, np.ndarray], repeat: int) -> float:
    """Fraction of run time spent inside generated kernels (wrapped with timers)."""
    spent = [0.0]
    originals = dict(compiled.kernels)

    def wrap(fn):  # type: ignore[no-untyped-def]
        def timed(*args):  # type: ignore[no-untyped-def]
            start = time.perf_counter()
            out = fn(*args)
            spent[0] += time.perf_counter() - start
            return out
        return timed

    compiled.kernels = {k: wrap(v) for k, v in originals.items()}
    compiled._executor = None
    compiled.run(feeds)
    spent[0] = 0.0
    start = time.perf_counter()
    for _ in range(repeat):
        compiled.run(feeds)
    total = time.perf_counter() - start
    compiled.kernels = originals
    compiled._executor = None
    return spent[0] / total if total else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--only", choices=("resnet50", "mobilenet_v2", "bert"), default=None)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    os.environ["TUNECACHE_BUILD_CACHE"] = tempfile.mkdtemp(prefix="model-latency-kernels-")
    hw = local_spec()
    work = Path(tempfile.mkdtemp(prefix="model-latency-"))
    models = {
        "ResNet-50 (batch 1, 224x224)": ("resnet50", resnet50_model(1, 224)),
        "MobileNet-v2, ReLU for ReLU6 (batch 1, 224x224)": ("mobilenet_v2",
                                                             mobilenet_v2_model(224)),
        "BERT-base encoder layer (batch 1, seq 128)": (
            "bert", bert_layer_model(17, True, batch=1, seq=128, hidden=768, heads=12)),
    }
    rows = []
    for label, (key, model) in models.items():
        if args.only and key != args.only:
            continue
        path = work / f"{key}.onnx"
        onnx.save(model, path)
        store = Store(work / f"store-{key}")
        feeds = random_feeds(model)
        t = time.perf_counter()
        untuned = compile_model(path, store=store, policy="analytic", record_wanted=False)
        cold_s = time.perf_counter() - t
        t = time.perf_counter()
        compile_model(path, store=store, policy="analytic", record_wanted=False)
        warm_s = time.perf_counter() - t
        untuned_ms = median_ms(lambda c=untuned, f=feeds: c.run(f), args.repeat)
        ops = kernel_ops(path)
        t = time.perf_counter()
        summary = run_job([Workload(op, count, lbl) for op, count, lbl in ops], hw, store,
                          JobOptions(trials=args.trials, refine=False, baseline=False))
        tune_s = time.perf_counter() - t
        store.publish(hw.hw_id)
        t = time.perf_counter()
        tuned = compile_model(path, store=store, policy="balanced", record_wanted=False)
        tuned_compile_s = time.perf_counter() - t
        hits = sum(e.action == "cache" for e in tuned.plan)
        ours_ms = median_ms(lambda c=tuned, f=feeds: c.run(f), args.repeat)
        share = kernel_share(tuned, feeds, max(3, args.repeat // 4))
        options = ort.SessionOptions()
        options.intra_op_num_threads = hw.cores
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        ort_ms = median_ms(lambda s=session, n=names, f=feeds: s.run(n, f), args.repeat)
        expected = session.run(names, feeds)
        got = tuned.run(feeds)
        err = max(float(np.max(np.abs(got[n] - e))) for n, e in zip(names, expected, strict=True))
        rows.append((label, len(tuned.plan), len(ops), summary.trials, tune_s, cold_s, warm_s,
                     tuned_compile_s, hits, untuned_ms, ours_ms, ort_ms, share, err))
        print(rows[-1], flush=True)
    lines = [machine_summary(), "",
             f"Revision `{git_revision()}`. Random weights; onnxruntime "
             f"{ort.__version__} with intra-op threads = {hw.cores}; our kernels use the "
             f"schedules' threads (the tuner chooses, up to {hw.cores}); medians of "
             f"{args.repeat} runs each; tuning job: `--trials {args.trials}` per distinct op, "
             "no refinement, cold build cache.", "",
             "| model | kernel nodes (distinct ops) | tuning job | cold compile | warm compile | "
             "compile, tuned cache (hits) | untuned latency | tuned latency | onnxruntime | "
             "tuned ÷ onnxruntime | time in kernels | max abs err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (label, nodes, distinct, trials, tune_s, cold_s, warm_s, tuned_c, hits, untuned_ms,
         ours_ms, ort_ms, share, err) in rows:
        lines.append(
            f"| {label} | {nodes} ({distinct}) | {trials} trials, {tune_s:.0f} s | "
            f"{cold_s:.2f} s | {warm_s:.2f} s | {tuned_c:.2f} s ({hits}/{nodes}) | "
            f"{untuned_ms:.2f} ms | {ours_ms:.2f} ms | {ort_ms:.2f} ms | "
            f"**{ours_ms / ort_ms:.2f}x** | {share:.0%} | {err:.1e} |")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(text)


if __name__ == "__main__":
    main()
