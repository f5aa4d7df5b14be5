"""Measure the matmuls that transformer exports compile to, for the seed (docs/SEED.md).

Exports the models of ``transformer_zoo.py`` named by ``--only``, takes the matmuls the
compiled model runs (``frontend.kernel_ops``, its planned shapes) and tunes them on this
machine at each core count of ``--cores`` (each a hardware spec of its own) into the store
``--root``: trials, refinement and explored schedules, measured again (``retune``). Then
``tunecache seed build <old seed> <root>`` folds them into the seed.

    python benchmarks/seed_transformer_matmuls.py --root /tmp/seed-rec [--cores 1,2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import transformer_zoo

from tunecache.cache.store import Store
from tunecache.compiler.frontend import kernel_ops
from tunecache.compiler.hardware import local_spec
from tunecache.datasets.suites import Workload
from tunecache.tuner.jobs import JobOptions, run_job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="store to measure into")
    parser.add_argument("--only", default="bert_base_s128,gpt2_prefill")
    parser.add_argument("--cores", default="1,2")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--explore", type=int, default=6)
    args = parser.parse_args()
    store = Store(args.root)
    with tempfile.TemporaryDirectory() as work:
        models = {key: transformer_zoo.export(key, Path(work))
                  for key in args.only.split(",")}
        for cores in (int(c) for c in args.cores.split(",")):
            hw = replace(local_spec(), cores=cores)
            for key, (path, feeds) in models.items():
                start = time.perf_counter()
                shapes = {name: tuple(value.shape) for name, value in feeds.items()}
                work_list = [Workload(op, count, label)
                             for op, count, label in kernel_ops(path, shapes, hw=hw)
                             if op.kind == "matmul"]
                run_job(work_list, hw, store,
                        JobOptions(trials=args.trials, explore=args.explore, retune=True,
                                   baseline=False, job_id=f"seed-{key}-{cores}c"))
                print(f"{hw.hw_id} {key}: {len(work_list)} matmuls, "
                      f"{time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
