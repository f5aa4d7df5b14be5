"""The seed's cost model across machines: leave-one-hardware-out and leave-one-op-out.

Reads the records of a seed store (default: the shipped one), and scores every (hardware,
op) group with a model that never saw its hardware (one fold per hardware id) and, separately,
with one that never saw its operator (k folds by operator). Per held-out hardware: the
model's and the analytic estimate's mean top-1 (best measured among the top-ranked one ÷
best measured) and top-5, and the median top-1. Figures go to docs/BENCHMARKS.md.

    python benchmarks/seed_model.py [--seed DIR] [--folds 5] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_revision, machine_summary, write_section

from tunecache.cache.store import Store
from tunecache.costmodel.model import cross_validate, prepare
from tunecache.datasets.seed import SEED_STORE
from tunecache.tuner.jobs.seed import read_manifest


def per_hardware(table: pd.DataFrame) -> pd.DataFrame:
    return table.groupby("hw_id").agg(
        ops=("op_id", "nunique"),
        model_top1=("model_top1", "mean"), analytic_top1=("analytic_top1", "mean"),
        model_top1_median=("model_top1", "median"),
        analytic_top1_median=("analytic_top1", "median"),
        model_top5=("model_top5", "mean"), analytic_top5=("analytic_top5", "mean"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=Path, default=SEED_STORE)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    data = prepare(Store(args.seed).load())
    manifest = read_manifest(args.seed)
    names = {h.hw_id: f"{h.cpu_model}, {h.isa}, {h.cores} core(s)"
             for h in (manifest.hardware if manifest else ())}
    splits = {"leave-one-hardware-out": cross_validate(data, by="hardware"),
              f"{args.folds}-fold by operator": cross_validate(data, folds=args.folds)}
    lines = [machine_summary(), "",
             f"Revision `{git_revision()}`; seed `{args.seed.name}` built "
             f"{manifest.built_at if manifest else '?'}, model "
             f"`{manifest.model_version if manifest else '?'}`: {data.source_rows} records → "
             f"{len(data.rows)} schedules in {len(data.groups)} (hardware, op) groups. Top-1: "
             "best measured among each ranking's first ÷ best measured in the group (1.0 = "
             "picked the fastest); means (medians) over the held-out groups.", "",
             "| split | held-out hardware | ops | model top-1 | analytic top-1 | model top-5 "
             "| analytic top-5 |", "|---|---|---|---|---|---|---|"]
    for split, ev in splits.items():
        for hw_id, r in per_hardware(ev.per_group).iterrows():
            lines.append(
                f"| {split} | `{hw_id}` ({names.get(str(hw_id), '?')}) | {int(r['ops'])} | "
                f"**{r['model_top1']:.3f}** ({r['model_top1_median']:.3f}) | "
                f"{r['analytic_top1']:.3f} ({r['analytic_top1_median']:.3f}) | "
                f"{r['model_top5']:.3f} | {r['analytic_top5']:.3f} |")
        m, a = ev.model, ev.analytic
        lines.append(f"| {split} | all | {ev.per_group['op_id'].nunique()} | "
                     f"**{m.top1:.3f}** | {a.top1:.3f} | {m.top5:.3f} | {a.top5:.3f} |")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(text)


if __name__ == "__main__":
    main()
