"""The seed: built by one command from real measurement files, shipped as a store of data."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pandas as pd
import pytest

from tunecache.cache.nearest import MAX_NEIGHBOURS, published_specs
from tunecache.cache.store import Store
from tunecache.compiler.hardware import HardwareSpec, hardware_distance, local_spec
from tunecache.costmodel import registry
from tunecache.costmodel.features import FEATURE_VERSION
from tunecache.datasets.location import resolve
from tunecache.datasets.seed import SEED_STORE
from tunecache.tuner.jobs.seed import SeedError, build_seed, read_manifest

FIXTURE = Path(__file__).parent / "fixtures" / "measurements.parquet"


@pytest.fixture(scope="module")
def two_machines(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Real measurements of 24 ops, and the same rows as if measured on a second machine
    (twice the cores): two Parquet files of store rows."""
    df = pd.read_parquet(FIXTURE)
    df = df[df["op_id"].isin(sorted(df["op_id"].unique())[:24])].reset_index(drop=True)
    spec = HardwareSpec.from_json(df["hw_json"].iloc[0])
    other = dataclasses.replace(spec, cores=spec.cores * 2, cpu_model="Second CPU")
    copy = df.copy()
    copy["hw_json"], copy["hw_id"] = other.to_json(), other.hw_id
    copy["hw_cores"], copy["hw_cpu_model"] = other.cores, other.cpu_model
    copy["record_id"] = [uuid.uuid4().hex for _ in range(len(copy))]
    base = tmp_path_factory.mktemp("sources")
    paths = [base / "first.parquet", base / "second.parquet"]
    df.to_parquet(paths[0])
    copy.to_parquet(paths[1])
    return paths


def test_one_command_builds_a_seed_store_of_data(two_machines: list[Path],
                                                 tmp_path: Path) -> None:
    out = tmp_path / "seed"
    done = subprocess.run([sys.executable, "-m", "tunecache.tuner.cli", "seed", "build",
                           *map(str, two_machines), "--out", str(out), "--folds", "3", "--json"],
                          capture_output=True, text=True, timeout=600, env={**os.environ})
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["records"] == 2 * len(pd.read_parquet(two_machines[0]))
    assert len(summary["hardware"]) == 2
    assert all(h["published"] == 24 for h in summary["hardware"])
    assert summary["by_hardware"]["split"].startswith("leave-one-hardware-out (2")
    assert summary["by_operator"]["split"].startswith("3-fold by operator")
    manifest = read_manifest(out)
    assert manifest is not None and manifest.model_version == summary["model_version"]
    # Everything in it is data: Parquet, JSON, and XGBoost's JSON model.
    suffixes = {p.suffix for p in out.rglob("*") if p.is_file()}
    assert suffixes <= {".parquet", ".json", ""}
    assert {p.name for p in out.rglob("*") if p.is_file() and not p.suffix} == {"CURRENT"}
    assert {s.hw_id for s in published_specs(resolve(out))} == \
        {h["hw_id"] for h in summary["hardware"]}
    model = registry.load_current(out)
    assert model is not None and model.version == summary["model_version"]
    assert model.transfers() == summary["model_transfers"]
    stored = pd.read_parquet(out / "records")
    assert stored["host"].isna().all()  # which hardware, not which machine


def test_a_model_is_used_on_unseen_hardware_only_when_it_transfers(
        two_machines: list[Path], tmp_path: Path) -> None:
    build_seed(two_machines, tmp_path / "seed", folds=2)
    model = registry.load_current(tmp_path / "seed")
    assert model is not None
    unseen = dataclasses.replace(local_spec(), cpu_model="Never measured")
    assert model.covers(unseen) == model.transfers()
    held = model.meta.metrics["by_hardware"]  # type: ignore[index]
    assert model.transfers() == (held["model"]["top1"] > held["analytic"]["top1"])


def test_a_rebuild_replaces_the_seed_and_a_foreign_directory_is_refused(
        two_machines: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "seed"
    build_seed(two_machines[:1], out, folds=2)
    assert len(read_manifest(out).hardware) == 1  # type: ignore[union-attr]
    build_seed(two_machines, out, folds=2)
    assert len(read_manifest(out).hardware) == 2  # type: ignore[union-attr]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed"]  # nothing left behind
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(SeedError, match="not a seed store"):
        build_seed(two_machines, tmp_path / "mine")
    with pytest.raises(SeedError, match="neither a store"):
        build_seed([tmp_path / "absent.parquet"], tmp_path / "other")


def test_a_seed_rebuilds_from_rows_of_another_seed_written_by_pandas(
        two_machines: list[Path], tmp_path: Path) -> None:
    """How a farm drops records (measured under an old protocol, say) from a seed: load its
    store in pandas (Arrow-backed dtypes), filter, write Parquet, build from that file."""
    build_seed(two_machines[:1], tmp_path / "seed", folds=2)
    rows = Store(tmp_path / "seed").load()
    kept = rows[rows["op_id"] != rows["op_id"].iloc[0]]
    kept.to_parquet(tmp_path / "kept.parquet", index=False)
    summary = build_seed([tmp_path / "kept.parquet"], tmp_path / "again", folds=2)
    assert summary.records == len(kept) and summary.hardware[0].published == 23


@pytest.mark.skipif(not SEED_STORE.is_dir(), reason="no seed shipped in this checkout")
def test_the_shipped_seed_is_current_and_verified() -> None:
    manifest = read_manifest(SEED_STORE)
    assert manifest is not None and manifest.hardware
    model = registry.load_current(SEED_STORE)  # refuses a model of another feature version
    assert model is not None and model.meta.feature_version == FEATURE_VERSION
    specs = published_specs(resolve(SEED_STORE))
    assert {s.hw_id for s in specs} == {h.hw_id for h in manifest.hardware}
    local = local_spec()
    done = subprocess.run([sys.executable, "-m", "tunecache.tuner.cli", "seed", "show",
                           "--json"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TUNECACHE_SEED": ""})
    assert done.returncode == 0, done.stderr
    here = json.loads(done.stdout)["here"]
    runnable = [s for s in specs if hardware_distance(local, s) is not None]
    others = [s for s in runnable if s.hw_id != local.hw_id]
    assert here["exact_entries"] > 0 or len(here["neighbours"]) == min(MAX_NEIGHBOURS,
                                                                        len(others))


def test_a_damaged_manifest_and_a_missing_seed_are_one_line_errors(
        two_machines: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "seed"
    build_seed(two_machines[:1], out, folds=2)
    (out / "SEED.json").write_text("{not json")
    with pytest.raises(SeedError, match=r"SEED\.json is damaged"):
        read_manifest(out)
    done = subprocess.run([sys.executable, "-m", "tunecache.tuner.cli", "seed", "show"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TUNECACHE_SEED": "off"})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: no seed: $TUNECACHE_SEED turns it off, or the shipped one is absent"]
