"""Collect cost-model training data on this machine: a nightly job with exploration.

The workloads are every distinct op of the real-model suites (ResNet-50, MobileNet-v2,
BERT-base, GPT-2) plus a seeded set of random but model-like shapes (matmuls of every layout
and epilogue, batched matmuls, dense, strided and depthwise convolutions). Each op gets the
tiler's ranked trials and refinement, as a nightly job would, plus ``--explore`` schedules
sampled from the whole legal grid, so the data also shows the model what the tiler misses.
Everything goes into a store (``--root``); the job resumes where it stopped when rerun.
``--fixture`` then writes the measurements (plus ``--merge`` files) as one compact Parquet
file for the tests and ``benchmarks/costmodel_quality.py``.

    python benchmarks/costmodel_data.py --root /tmp/cm-store [--random 60] [--explore 26]
        [--fixture tests/fixtures/measurements.parquet --merge OLD.parquet]

``--ops FILE`` measures the ops of a file instead (one op text per line, ``#`` comments):
how records of an older timing protocol or codegen version are measured again
(docs/SEED.md).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tunecache.cache.store import Store
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.ops import OpSignature
from tunecache.datasets.suites import SUITES, Workload
from tunecache.tuner.jobs import JobOptions, run_job
from tunecache.tuner.measure import MeasureResult

SUITE_NAMES = ("resnet50", "mobilenet_v2", "bert_base", "gpt2")
MAX_FLOPS = 1.5e9  # keeps one op's sweep under a minute here
CHANNELS = (3, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 384, 512)


def _log_int(rng: np.random.Generator, lo: int, hi: int) -> int:
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def random_op(rng: np.random.Generator) -> OpSignature:
    """One model-like op: a third matmuls, a sixth batched, half convolutions."""
    kind = rng.choice(["matmul", "batch_matmul", "conv2d"], p=[0.35, 0.15, 0.5])
    epilogues = ("", "bias", "relu", "bias+relu")
    if kind == "matmul":
        m = int(rng.choice([1, 1, _log_int(rng, 2, 16), _log_int(rng, 16, 1024)]))
        n, k = _log_int(rng, 8, 4096), _log_int(rng, 8, 2048)
        trans = rng.choice(["nn", "nn", "nt", "tn"])
        return matmul_op(m, n, k, trans_a=trans == "tn", trans_b=trans == "nt",
                                  epilogue=str(rng.choice(epilogues)))
    if kind == "batch_matmul":
        return batch_matmul_op(
            _log_int(rng, 2, 16), _log_int(rng, 8, 256), _log_int(rng, 8, 256),
            _log_int(rng, 8, 256), trans_b=bool(rng.random() < 0.5),
            shared=str(rng.choice(["none", "none", "b"])))
    size = int(rng.choice([7, 14, 28, 56, 112]))
    depthwise = rng.random() < 0.25
    r = int(rng.choice([1, 3, 3, 5, 7])) if not depthwise else int(rng.choice([3, 3, 5]))
    stride = int(rng.choice([1, 1, 2]))
    c = int(rng.choice(CHANNELS[1:] if depthwise else CHANNELS))
    f = c if depthwise else int(rng.choice(CHANNELS[1:]))
    return conv2d_op(1, c, size, size, f, r, r, stride=stride, pads=r // 2,
                              groups=c if depthwise else 1,
                              epilogue=str(rng.choice(["bias", "bias+relu", "bias+add"])))


def random_ops(n: int, seed: int, exclude: set[str]) -> list[OpSignature]:
    rng = np.random.default_rng(seed)
    ops: dict[str, OpSignature] = {}
    while len(ops) < n:
        op = random_op(rng)
        if op.flops <= MAX_FLOPS and op.op_id not in exclude:
            ops.setdefault(op.op_id, op)
    return list(ops.values())


def listed_workloads(path: Path) -> list[Workload]:
    """The ops of ``path``, one op text per line (blank lines and ``#`` comments skipped);
    a line that is not an op names its line number and stops the job before it starts."""
    chosen: dict[str, Workload] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            op = OpSignature.parse(text)
        except ValueError as exc:
            raise SystemExit(f"error: {path}:{number}: not an op text ({exc})") from None
        chosen.setdefault(op.op_id, Workload(op, 1, "listed"))
    return list(chosen.values())


def workloads(n_random: int, seed: int) -> list[Workload]:
    chosen: dict[str, Workload] = {}
    for name in SUITE_NAMES:
        for w in SUITES[name].workloads:
            chosen.setdefault(w.op.op_id, Workload(w.op, 1, f"{name}: {w.label}"))
    for op in random_ops(n_random, seed, set(chosen)):
        chosen[op.op_id] = Workload(op, 1, "random")
    return list(chosen.values())


class Progress:
    """One line per op on stderr."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.count = 0

    def op_started(self, index: int, total: int, workload: Workload, share: float | None) -> None:
        self.count = 0
        print(f"[{index + 1}/{total}] {time.monotonic() - self.start:6.0f}s "
              f"{workload.op.text[:90]}", file=sys.stderr, flush=True)

    def measured(self, result: MeasureResult) -> None:
        self.count += 1

    def op_finished(self, item: object) -> None:
        pass


def write_fixture(frames: list[pd.DataFrame], path: Path) -> None:
    """One Parquet file of measurements, deduplicated by record id, zstd-compressed."""
    df = pd.concat(frames, ignore_index=True).drop_duplicates("record_id")
    df.to_parquet(path, compression="zstd", index=False)
    print(f"fixture: {len(df)} measurements of {df['op_id'].nunique()} ops, "
          f"{path.stat().st_size / 1e6:.2f} MB → {path}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="store to fill (resumable)")
    parser.add_argument("--random", type=int, default=60, help="random ops besides the suites")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--explore", type=int, default=26)
    parser.add_argument("--limit", type=int, default=None, help="only the first N ops")
    parser.add_argument("--fixture", type=Path, default=None, help="write a fixture Parquet")
    parser.add_argument("--merge", type=Path, action="append", default=[],
                        help="other measurement Parquet files to include in the fixture")
    parser.add_argument("--ops", type=Path, default=None,
                        help="measure the ops of this file (one op text per line) instead of "
                             "the suites and random ops")
    parser.add_argument("--list", action="store_true", help="print the ops and exit")
    parser.add_argument("--export-only", action="store_true",
                        help="only write --fixture from the store, measure nothing")
    args = parser.parse_args()
    if args.ops is not None and not args.ops.is_file():
        raise SystemExit(f"error: --ops {args.ops}: no such file")
    todo = (listed_workloads(args.ops) if args.ops is not None
            else workloads(args.random, args.seed))[: args.limit]
    if args.list:
        for w in todo:
            print(w.label, w.op.text, f"{w.op.flops / 1e6:.1f} MFLOP")
        return
    store = Store(args.root)
    if not args.export_only:
        collect(store, todo, args)
    if args.fixture:
        frames = [store.load(), *(pd.read_parquet(p) for p in args.merge)]
        write_fixture(frames, args.fixture)


def collect(store: Store, todo: list[Workload], args: argparse.Namespace) -> None:
    hw = local_spec()
    options = JobOptions(trials=args.trials, explore=args.explore, refine=True, baseline=False,
                         job_id=f"costmodel-data-{args.seed}")
    summary = run_job(todo, hw, store, options, progress=Progress())
    store.compact(hw.hw_id)
    tuned = sum(o.status == "tuned" for o in summary.ops)
    print(f"{tuned} ops tuned, {summary.trials} measurements, {summary.seconds:.0f} s",
          file=sys.stderr)


if __name__ == "__main__":
    main()
