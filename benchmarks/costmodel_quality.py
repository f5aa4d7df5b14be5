"""How good is the learned cost model on operators it has never seen?

Real measurements (default: the committed fixture, ``tests/fixtures/measurements.parquet``;
or ``--root`` for a store, ``--data`` for any Parquet file of store rows) are grouped per
(op, hardware). Operators are dealt into k folds; each fold is scored by a model trained on
the other folds only, so every operator is held out exactly once. Reported for the model and
for the tiler's analytic estimate alone: top-1 / top-5 score (best measured among the top-k
÷ best measured), pairwise accuracy, Spearman; and search efficiency — replaying the recorded
measurements in model order, in analytic-estimate order and in random order (exact mean over
all orders), how many measurements until one is within 0.95 of the best. The objectives are
compared the same way. Training time is measured on 100k synthetic rows made by resampling
the real ones with perturbed op shapes and latencies (for timing only).

    python benchmarks/costmodel_quality.py [--data PARQUET | --root STORE] [--folds 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_revision, machine_summary, write_section

from tunecache.compiler.ops import OpSignature
from tunecache.costmodel import features as F
from tunecache.costmodel.model import (
    CostModel,
    Evaluation,
    TrainParams,
    cross_validate,
    prepare,
)

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "measurements.parquet"
PLOT = "costmodel_quality.png"


def synthetic_rows(real: pd.DataFrame, n: int, seed: int = 0) -> pd.DataFrame:
    """About ``n`` rows: copies of the real ones with each copy's op shapes and latencies
    perturbed (matmul M, N, K or conv2d H, W scaled per op, latency scaled by the FLOP ratio
    with noise)."""
    rng = np.random.default_rng(seed)
    texts = real["op_text"].astype(str)
    ops = {t: OpSignature.parse(t) for t in texts.unique()}
    copies = []
    for c in range(int(np.ceil(n / len(real)))):
        new_text = {}
        for text, op in ops.items():
            if c == 0:
                new_text[text] = op
                continue
            # matmul: scale M, N, K; conv2d: scale the image (H, W stay >= the kernel), which
            # keeps channels and groups consistent
            scaled = ("M", "N", "K") if op.kind != "conv2d" else ("H", "W")
            floor = {"H": op.dim("R"), "W": op.dim("S")} if op.kind == "conv2d" else {}
            dims = tuple((name, max(floor.get(name, 1), round(v * 2 ** rng.uniform(-1, 1))))
                         if name in scaled else (name, v) for name, v in op.dims)
            new_text[text] = OpSignature(op.kind, dims, op.dtype, op.attrs, op.epilogue)
        part = real.copy()
        new_ops = texts.map(new_text)
        part["op_text"] = new_ops.map(lambda o: o.text)
        part["op_id"] = new_ops.map(lambda o: o.op_id)
        ratio = new_ops.map(lambda o: o.flops).to_numpy() / texts.map(
            lambda t: ops[t].flops).to_numpy()
        median = pd.to_numeric(part["median_s"], errors="coerce").to_numpy(dtype=float,
                                                                          na_value=np.nan)
        part["median_s"] = median * ratio * rng.lognormal(0, 0.1, len(part))
        copies.append(part)
    return pd.concat(copies, ignore_index=True).iloc[:n]


def objective_table(data: object, folds: int) -> tuple[list[dict[str, object]], dict[str, Evaluation]]:
    variants = {
        "rank:ndcg, graded labels (default)": TrainParams(),
        "rank:ndcg without the analytic prior": TrainParams(prior_weight=0.0),
        "rank:pairwise, pair_method=mean": TrainParams(objective="rank:pairwise",
                                                       pair_method="mean"),
        "rank:pairwise, pair_method=topk": TrainParams(objective="rank:pairwise"),
        "reg:squarederror (pointwise)": TrainParams(objective="reg:squarederror"),
    }
    rows, evals = [], {}
    for name, params in variants.items():
        start = time.perf_counter()
        ev = cross_validate(data, folds=folds, params=params)  # type: ignore[arg-type]
        evals[name] = ev
        rows.append({"objective": name, "top1": ev.model.top1, "top5": ev.model.top5,
                     "pairwise": ev.model.pairwise, "spearman": ev.model.spearman,
                     "to_reach": ev.search.model, "cv_s": time.perf_counter() - start})
        print(f"{name}: top1 {ev.model.top1:.3f} top5 {ev.model.top5:.3f} "
              f"pairwise {ev.model.pairwise:.3f} ({rows[-1]['cv_s']:.1f} s)", flush=True)
    return rows, evals


def time_training(real: pd.DataFrame, n: int) -> dict[str, float]:
    df = synthetic_rows(real, n)
    start = time.perf_counter()
    data = prepare(df)
    prep_s = time.perf_counter() - start
    start = time.perf_counter()
    CostModel.fit(data)
    fit_s = time.perf_counter() - start
    return {"rows": len(df), "schedules": len(data.rows), "groups": len(data.groups),
            "prepare_s": prep_s, "fit_s": fit_s, "total_s": prep_s + fit_s}


def noise(real: pd.DataFrame, retest: pd.DataFrame | None) -> list[str]:
    """What the measurements' own noise allows: within-measurement spread, and with a second
    measurement of the same schedules, how well one run ranks the other (a ceiling)."""
    out = []
    if "runtimes_s" in real.columns:
        runs = real.loc[real["status"] == "ok", "runtimes_s"].dropna()
        spread = runs.map(lambda r: (max(r) - min(r)) / float(np.median(r)) if len(r) else np.nan)
        out.append(f"Measurement noise: spread of the repeats within one measurement, "
                   f"(max − min) ÷ median, median {spread.median():.2f}, 90th percentile "
                   f"{spread.quantile(0.9):.2f}.")
    if retest is not None:
        from tunecache.costmodel import metrics as M

        key = ["hw_id", "op_id", "schedule_json"]
        ok_a = real[real["status"] == "ok"][[*key, "record_id", "median_s"]]
        ok_b = retest[retest["status"] == "ok"][[*key, "record_id", "median_s"]]
        both = ok_a.merge(ok_b, on=key, suffixes=("_a", "_b"))
        # the data may already hold the retest's records: pair only distinct measurements
        both = both[~both["record_id_a"].isin(ok_b["record_id"])]
        sp, t1 = [], []
        for _, g in both.groupby(["hw_id", "op_id"]):
            if len(g) < 2:
                continue
            la = (g["median_s_a"].min() / g["median_s_a"]).to_numpy(dtype=float)
            lb = (g["median_s_b"].min() / g["median_s_b"]).to_numpy(dtype=float)
            sp.append(M.spearman(lb, la))
            t1.append(M.topk_score(lb, la, 1))
        out.append(f"Test–retest on {len(sp)} ops measured twice ({len(both)} schedules): "
                   f"ranking one run by the other's medians gives Spearman {np.nanmean(sp):.2f} "
                   f"and top-1 score {np.mean(t1):.2f} — a ceiling for any ranker judged "
                   "against these labels.")
    return out


def plot(ev: Evaluation, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: pip install 'tunecache[plots]' for the PNG", file=sys.stderr)
        return False
    t = ev.per_group
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for col, label in (("model_top1", "model"), ("analytic_top1", "analytic estimate")):
        values = np.sort(t[col].to_numpy(dtype=float))
        axes[0].plot(values, (np.arange(len(values)) + 1) / len(values), drawstyle="steps-post",
                     label=label)
    axes[0].set_xlabel("top-1 score (best of top-1 ÷ best measured)")
    axes[0].set_ylabel("fraction of held-out ops (CDF)")
    axes[0].legend(loc="upper left")
    axes[0].set_title("Top-1 on held-out operators")
    width = 0.27
    x = np.arange(len(t))
    for i, (col, label) in enumerate((("model_to_reach", "model"),
                                      ("analytic_to_reach", "analytic"),
                                      ("random_to_reach", "random (mean)"))):
        axes[1].bar(x + (i - 1) * width, t[col].to_numpy(dtype=float), width, label=label)
    axes[1].set_xlabel("held-out op")
    axes[1].set_ylabel("measurements to reach 0.95 of best")
    axes[1].set_yscale("log")
    axes[1].legend(loc="upper right", fontsize=8)
    axes[1].set_title("Search efficiency (replay)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def verdict(ok: bool) -> str:
    return "meets target" if ok else "**misses target**"


def render(ev: Evaluation, objectives: list[dict[str, object]], timing: dict[str, float],
           source: str, plotted: bool, noise_lines: list[str]) -> str:
    m, a, s = ev.model, ev.analytic, ev.search
    d = ev.data
    n_ok = int((d.labels > 0).sum())
    lines = [
        machine_summary(), "",
        f"Revision `{git_revision()}`; features v{F.FEATURE_VERSION} ({len(F.FEATURE_NAMES)} "
        f"columns); data: {source} — {d.source_rows} measurements → {len(d.rows)} schedules "
        f"({n_ok} ok, {len(d.rows) - n_ok} failed) in {len(d.groups)} (op, hardware) groups, "
        f"{d.groups['op_id'].nunique()} ops. Split **by operator**: {ev.split}; every op is "
        "scored by a model that never saw it. Means over held-out ops (worst op in brackets).",
        "",
        "| held-out ops | model | analytic estimate | target |", "|---|---|---|---|",
        f"| top-1 score | {m.top1:.3f} ({m.top1_worst:.3f}) | {a.top1:.3f} ({a.top1_worst:.3f}) "
        f"| ≥ 0.90, clearly above analytic: {verdict(m.top1 >= 0.90 and m.top1 > a.top1)} |",
        f"| top-5 score | {m.top5:.3f} ({m.top5_worst:.3f}) | {a.top5:.3f} ({a.top5_worst:.3f}) "
        f"| ≥ 0.97: {verdict(m.top5 >= 0.97)} |",
        f"| pairwise accuracy | {m.pairwise:.3f} | {a.pairwise:.3f} | |",
        f"| Spearman | {m.spearman:.3f} | {a.spearman:.3f} | |",
        "",
        *[line + "\n" for line in noise_lines],
        "Search efficiency (replay of the recorded measurements): measurements until one is "
        f"within {s.reach:.2f} of the best, mean over ops. Random = exact mean over all orders "
        "((n+1)/(good+1) per op).", "",
        "| order | measurements | vs random |", "|---|---|---|",
        f"| model-guided | {s.model:.2f} | {s.random / s.model:.1f}× fewer "
        f"(target ≥ 3×: {verdict(s.random / s.model >= 3)}) |",
        f"| tiler-ordered (analytic estimate) | {s.analytic:.2f} | {s.random / s.analytic:.1f}× fewer |",
        f"| random | {s.random:.2f} | 1× |",
        "",
        f"Training time, {timing['rows']:,} synthetic rows (the real rows resampled with "
        "perturbed op shapes and latencies — for timing only; "
        f"{timing['schedules']:,} schedules in {timing['groups']:,} groups): featurise + "
        f"label {timing['prepare_s']:.1f} s, XGBoost {timing['fit_s']:.1f} s, total "
        f"**{timing['total_s']:.1f} s** (target ≤ 60 s: {verdict(timing['total_s'] <= 60)}).",
        "",
        "Objective and prior (same folds; the default starts boosting from the analytic "
        "estimate, see COSTMODEL.md):", "",
        "| objective | top-1 | top-5 | pairwise | Spearman | to reach 0.95 | CV time |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in objectives:
        lines.append(f"| {r['objective']} | {r['top1']:.3f} | {r['top5']:.3f} | "
                     f"{r['pairwise']:.3f} | {r['spearman']:.3f} | {r['to_reach']:.2f} | "
                     f"{r['cv_s']:.1f} s |")
    lines.append("")
    if plotted:
        lines += [f"![cost model quality]({PLOT})", ""]
    lines += ["| held-out op | schedules (failed) | top-1 model | top-1 analytic | "
              "to reach: model | analytic | random |", "|---|---|---|---|---|---|---|"]
    for _, r in ev.per_group.iterrows():
        lines.append(f"| `{r['op_text']}` | {r['candidates']} ({r['failed']}) | "
                     f"{r['model_top1']:.3f} | {r['analytic_top1']:.3f} | "
                     f"{r['model_to_reach']:.0f} | {r['analytic_to_reach']:.0f} | "
                     f"{r['random_to_reach']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="Parquet file of store rows")
    parser.add_argument("--root", default=None, help="store root to read instead")
    parser.add_argument("--folds", type=int, default=8, help="operator folds")
    parser.add_argument("--train-rows", type=int, default=100_000)
    parser.add_argument("--data-label", default=None,
                        help="how to describe the data in the report (default: its path)")
    parser.add_argument("--retest", type=Path, default=None,
                        help="a second measurement of the same schedules (noise ceiling)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.root:
        import tunecache.datasets as tds

        real = tds.load(args.root)
        source = f"store {args.root}"
    else:
        path = args.data or FIXTURE
        real = pd.read_parquet(path)
        source = f"`{path.relative_to(REPO) if path.is_relative_to(REPO) else path}`"
    if args.data_label:
        source = args.data_label
    data = prepare(real)
    objectives, evals = objective_table(data, args.folds)
    ev = evals["rank:ndcg, graded labels (default)"]
    print(f"timing training on {args.train_rows} synthetic rows ...", flush=True)
    timing = time_training(real, args.train_rows)
    print(json.dumps(timing))
    plotted = False if args.no_write else plot(ev, REPO / "docs" / PLOT)
    retest = pd.read_parquet(args.retest) if args.retest else None
    text = render(ev, objectives, timing, source, plotted, noise(real, retest))
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"evaluation": ev.to_dict(), "objectives": objectives,
                                         "training": timing}, indent=2, default=float))
    if not args.no_write:
        write_section(text)


if __name__ == "__main__":
    main()
