"""Building the seed store shipped with tunecache (or a farm's own): one command, data only.

:func:`build_seed` gathers measurement records from stores and Parquet files, writes them
into a fresh store, publishes every hardware (each snapshot with its ``HARDWARE.json``),
trains the cost model with both held-out evaluations recorded in its metadata (by operator,
and leave-one-hardware-out when there are several machines: that evaluation decides whether
the model is used on hardware it never saw) and writes ``SEED.json``, a manifest of what it
holds. The new store replaces the old one only when complete. Host names are dropped: the
seed says which *hardware* measured what, not which machine.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from tunecache.cache.store import Store
from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.files import read_regular
from tunecache.costmodel import registry
from tunecache.costmodel.model import CostModel, cross_validate, prepare
from tunecache.datasets import io
from tunecache.datasets.schema import STATUSES

MANIFEST = "SEED.json"
MAX_MANIFEST_BYTES = 1 << 20
SEED_FORMAT = 1


class SeedError(TunecacheError):
    """A seed could not be built from what was given."""


@dataclass(frozen=True)
class SeedHardware:
    """One machine (hardware spec) the seed holds measurements of."""

    hw_id: str
    isa: str
    cores: int
    cpu_model: str
    records: int
    ops: int
    published: int


@dataclass(frozen=True)
class SeedSummary:
    """What a seed store holds (also its ``SEED.json``)."""

    path: str
    built_at: str
    records: int
    hardware: tuple[SeedHardware, ...]
    model_version: str | None
    by_operator: dict[str, Any] | None
    by_hardware: dict[str, Any] | None
    model_transfers: bool
    bytes: int
    seed_format: int = SEED_FORMAT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SeedSummary:
        hardware = tuple(SeedHardware(**h) for h in data.get("hardware", ()))
        return cls(**{**data, "hardware": hardware})


def read_records(source: str | os.PathLike[str]) -> pd.DataFrame:
    """The records of a store (directory or URI) or of a Parquet file of store rows."""
    text = os.fspath(source)
    if text.endswith(".parquet") and Path(text).is_file():
        # Through Arrow, not pd.read_parquet: a file written from ``Store.load()`` keeps
        # pandas metadata of Arrow-backed dtypes that pandas cannot read back.
        return io.to_pandas(pq.read_table(text))
    if "://" not in text and not Path(text).is_dir():
        raise SeedError(f"{text!r} is neither a store directory, a store URI nor a "
                        ".parquet file of records")
    return Store(text).load()


def _gather(sources: Sequence[str | os.PathLike[str]]) -> pd.DataFrame:
    frames = [read_records(s) for s in sources]
    frames = [f for f in frames if len(f)]
    if not frames:
        raise SeedError("the sources hold no records")
    df = pd.concat(frames, ignore_index=True).drop_duplicates("record_id")
    df = df[df["status"].isin(STATUSES)].reset_index(drop=True)
    df["host"] = None
    return df


def _train(df: pd.DataFrame, folds: int) -> tuple[CostModel, dict[str, Any]]:
    data = prepare(df)
    metrics: dict[str, Any] = {}
    if data.groups["op_id"].nunique() >= 2:
        metrics = cross_validate(data, folds=folds).to_dict(per_group=False)
    if data.groups["hw_id"].nunique() >= 2:
        metrics["by_hardware"] = cross_validate(data, by="hardware").to_dict(per_group=False)
    return CostModel.fit(data, metrics=metrics or None), metrics


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def build_seed(sources: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *,
               folds: int = 5, log: Callable[[str], None] = lambda _: None) -> SeedSummary:
    """Build a seed store at ``out`` from the records of ``sources`` (see the module doc)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise SeedError(f"{out} exists and is not a seed store ({MANIFEST} missing); "
                        "give an empty or new directory")
    df = _gather(sources)
    log(f"{len(df)} records of {df['hw_id'].nunique()} hardware, {df['op_id'].nunique()} ops")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".seed-", dir=out.parent))
    try:
        store = Store(work)
        store.append(df)
        store.compact()
        published = {r.hw_id: r.entries for r in store.publish()}
        log(f"published {sum(published.values())} entries; training the cost model")
        model, metrics = _train(df, folds)
        registry.save(model, work)
        summary = replace(_summary(df, published, model, metrics, out), bytes=_size(work))
        (work / MANIFEST).write_text(json.dumps(summary.to_dict(), indent=2, sort_keys=True)
                                     + "\n")
        _swap(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return summary


def _summary(df: pd.DataFrame, published: dict[str, int], model: CostModel,
             metrics: dict[str, Any], out: Path) -> SeedSummary:
    hardware = []
    for hw_id, rows in sorted(df.groupby("hw_id"), key=lambda item: str(item[0])):
        first = rows.iloc[0]
        hardware.append(SeedHardware(str(hw_id), str(first["hw_isa"]), int(first["hw_cores"]),
                                     str(first["hw_cpu_model"]), len(rows),
                                     int(rows["op_id"].nunique()), published.get(str(hw_id), 0)))
    by_hardware = metrics.get("by_hardware")
    by_operator = {k: v for k, v in metrics.items() if k != "by_hardware"} or None
    return SeedSummary(str(out), datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       len(df), tuple(hardware), model.version, by_operator, by_hardware,
                       model.transfers(), 0)


def _swap(work: Path, out: Path) -> None:
    """Make ``work`` the store at ``out``; the old one is removed only after."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    work.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_manifest(root: str | os.PathLike[str]) -> SeedSummary | None:
    """The manifest of a seed store, or None when it has none."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        return None
    try:
        return SeedSummary.from_dict(json.loads(read_regular(path, MAX_MANIFEST_BYTES)))
    except (ValueError, TypeError, OSError) as exc:
        raise SeedError(f"{path} is damaged: {exc}") from None
