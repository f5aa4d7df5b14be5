"""``tunecache model ...``: train, evaluate and show the learned cost model."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import click
import pandas as pd

from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.hardware import local_spec
from tunecache.costmodel import registry
from tunecache.costmodel.model import (
    REQUIRED_COLUMNS,
    CostModel,
    Evaluation,
    TrainingSet,
    cross_validate,
    prepare,
)
from tunecache.datasets import location
from tunecache.tuner.cli.common import (
    echo_held_out,
    emit_json,
    folds_option_with,
    hardware_option,
    json_option,
    root_option,
    score,
)


class ModelCommandError(TunecacheError):
    """A ``tunecache model`` command cannot do what was asked."""


_COLUMNS = [*REQUIRED_COLUMNS, "record_id"]


def _load_store(root: str | None) -> pd.DataFrame:
    import tunecache.datasets as tds

    df = tds.load(root, columns=_COLUMNS)
    if df.empty:
        raise ModelCommandError(
            f"no measurement records in the store {location.resolve(root).uri}; measure "
            "some first (tunecache bench-op, or a tuning job)"
        )
    return df


def _load_data(root: str | None, data: str | None) -> pd.DataFrame:
    if data is None:
        return _load_store(root)
    try:
        return pd.read_parquet(data)
    except (OSError, ValueError) as exc:
        raise ModelCommandError(f"cannot read {data}: {exc}") from None


def _load_model(spec: str, root: str | None) -> CostModel:
    if spec == "current":
        found = registry.find_serving(root)
        if found is None:
            raise ModelCommandError("no current model: none trained in the store and no "
                                    "shipped seed model; train one with `tunecache model train`")
        return found.model
    return CostModel.load(spec)


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ModelCommandError("--png needs matplotlib: pip install 'tunecache[plots]'") from None


def _describe(ev: Evaluation) -> str:
    m, a, s = ev.model, ev.analytic, ev.search
    lines = [
        f"evaluation: {ev.split}, {m.groups} (op, hardware) groups",
        f"{'':24}{'model':>10}{'analytic':>10}",
        f"{'top-1 score (mean)':24}{score(m.top1):>10}{score(a.top1):>10}",
        f"{'top-5 score (mean)':24}{score(m.top5):>10}{score(a.top5):>10}",
        f"{'top-1 score (worst op)':24}{score(m.top1_worst):>10}{score(a.top1_worst):>10}",
        f"{'pairwise accuracy':24}{score(m.pairwise):>10}{score(a.pairwise):>10}",
        f"{'Spearman':24}{score(m.spearman):>10}{score(a.spearman):>10}",
        f"measurements to reach {s.reach:.2f} of the best (mean): model {s.model:.2f}, "
        f"analytic {s.analytic:.2f}, random {s.random:.2f} ({s.vs_random:.1f}x fewer than random)",
    ]
    return "\n".join(lines)


def plot_scatter(ev: Evaluation, path: str | os.PathLike[str]) -> None:
    """Predicted score (standardised within each group) against measured speed vs the best."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data: TrainingSet = ev.data
    scores = pd.Series(ev.scores)
    by = pd.Series(data.group)
    z = (scores - scores.groupby(by).transform("mean")) / \
        scores.groupby(by).transform("std").replace(0, 1)
    labels = data.labels
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    failed = labels == 0
    ax.scatter(labels[~failed], z[~failed], s=6, alpha=0.4, label="measured ok")
    if failed.any():
        ax.scatter(labels[failed], z[failed], s=10, marker="x", color="red", alpha=0.6,
                   label="failed (0)")
    ax.set_xlabel("measured speed ÷ best in its group (1.0 = fastest)")
    ax.set_ylabel("model score, standardised within group")
    ax.set_title(f"Cost model, {ev.split}: Spearman {ev.model.spearman:.2f}")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@click.group("model")
def model_group() -> None:
    """The learned cost model that ranks candidate schedules."""


@model_group.command("train")
@root_option
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Save to this directory instead of the store (does not change CURRENT).")
@folds_option_with("By-operator cross-validation folds for the recorded metrics (0: skip).")
@json_option
def model_train(root: str | None, out: str | None, folds: int, as_json: bool) -> None:
    """Train on the store's records; save it in the store and make it current."""
    df = _load_store(root)
    data = prepare(df)
    metrics = None
    n_ops = int(data.groups["op_id"].nunique())
    if folds and n_ops >= 2:
        metrics = cross_validate(data, folds=folds).to_dict(per_group=False)
        if data.groups["hw_id"].nunique() >= 2:
            metrics["by_hardware"] = cross_validate(data, by="hardware").to_dict(
                per_group=False)
    start = time.perf_counter()
    model = CostModel.fit(data, metrics=metrics)
    elapsed = time.perf_counter() - start
    if out is not None:
        where = str(model.save(out))
        current = False
    else:
        registry.save(model, root)
        where = f"{location.resolve(root).uri}/{registry.MODELS_DIR}/{model.version}"
        current = True
    summary = {"model_version": model.version, "path": where, "current": current,
               "train_seconds": round(elapsed, 3), "training": model.meta.training,
               "metrics": metrics}
    if as_json:
        emit_json(summary)
        return
    t = model.meta.training
    click.echo(f"trained {model.version} on {t['rows']} schedules in {t['groups']} groups "
               f"({t['ops']} ops, {len(t['hw_ids'])} hardware, {t['failed_rows']} failed) "
               f"in {elapsed:.1f} s")
    click.echo(f"saved: {where}" + (" (current)" if current else ""))
    echo_held_out(metrics, model.transfers())


@model_group.command("eval")
@root_option
@click.option("--data", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Evaluate on this Parquet file of store rows instead of the store.")
@click.option("--model", "model_spec", default=None, metavar="DIR|current",
              help="Evaluate this saved model on the data (default: by-operator "
                   "cross-validation of fresh models).")
@folds_option_with("Cross-validation folds (without --model).")
@click.option("--png", type=click.Path(dir_okay=False), default=None,
              help="Write a predicted-vs-measured scatter plot (needs the plots extra).")
@json_option
def model_eval(root: str | None, data: str | None, model_spec: str | None, folds: int,
               png: str | None, as_json: bool) -> None:
    """Ranking quality: model vs the analytic estimate, and search efficiency."""
    if png:
        _need_matplotlib()
    frame = _load_data(root, data)
    if model_spec is None:
        ev = cross_validate(frame, folds=folds)
    else:
        ev = _load_model(model_spec, root).evaluate(frame)
    if png:
        plot_scatter(ev, png)
    if as_json:
        emit_json(ev.to_dict() | ({"png": str(Path(png))} if png else {}))
        return
    click.echo(_describe(ev))
    if png:
        click.echo(f"plot: {png}")


@model_group.command("show")
@root_option
@hardware_option
@click.option("--model", "model_dir", default=None, type=click.Path(file_okay=False),
              help="Show this model directory instead of the store's current model.")
@json_option
def model_show(root: str | None, hardware: Path | None, model_dir: str | None,
               as_json: bool) -> None:
    """The model a compile here ranks candidates with (the store's trained one, else the
    shipped seed's), or a given one; and the models stored."""
    source: str | None = "directory"
    hw_id = store_current = None
    if model_dir is not None:
        model: CostModel | None = CostModel.load(model_dir)
        stored: list[str] = []
    else:
        hw_id = local_spec(hardware).hw_id
        found = registry.find_serving(root, hw_id)
        model, source = (found.model, found.source) if found is not None else (None, None)
        store_current = registry.current_version(root)
        stored = registry.list_versions(root)
    meta = _meta(model) if model is not None else None
    if as_json:
        emit_json({"current": meta, "source": source, "hw_id": hw_id,
                   "store_current": store_current, "stored": stored})
        return
    if meta is None:
        click.echo(f"no current model for {hw_id}: none trained in the store covers it, and "
                   "no seed model does; train one with `tunecache model train`")
    else:
        _echo_meta(meta, _SOURCE_NOTE[source or "directory"].format(hw_id=hw_id))
    if store_current is not None and (model is None or model.version != store_current):
        click.echo(f"the store's current model {store_current} is not used on {hw_id}: not "
                   "trained on it, and it does not transfer")
    if stored:
        click.echo("stored: " + ", ".join(stored))


_SOURCE_NOTE = {
    registry.TRAINED: "trained on this store's records; ranks compiles on {hw_id}",
    registry.SEED: "the shipped seed's model; ranks compiles on {hw_id}, which no model "
                   "trained in this store covers",
    "directory": "from the given directory",
}


def _meta(model: CostModel) -> dict[str, Any]:
    """``model``'s metadata as ``model show`` reports it."""
    meta: dict[str, Any] = {k: v for k, v in model.meta.__dict__.items()
                            if k != "feature_names"}
    meta["features"] = len(model.meta.feature_names)
    meta["transfers"] = model.transfers()
    return meta


def _echo_meta(meta: dict[str, Any], note: str) -> None:
    t = meta["training"]
    click.echo(f"model {meta['model_version']} ({note})")
    click.echo(f"feature version {meta['feature_version']}, {meta['features']} features, "
               f"created {meta['created_at']}")
    click.echo(f"trained on {t['rows']} schedules, {t['groups']} groups, {t['ops']} ops, "
               f"hardware {', '.join(t['hw_ids'])}; data fingerprint {t['fingerprint']}")
    echo_held_out(meta.get("metrics"), bool(meta.get("transfers")))
    libs = ", ".join(f"{k} {v}" for k, v in sorted(meta["libraries"].items()))
    click.echo(f"libraries: {libs}")


COMMANDS = [model_group]
