"""``tunecache model train | eval | show`` end to end, in real subprocesses."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from costmodel_support import FIXTURE, fixture_frame

from tunecache.cache.store import Store
from tunecache.compiler.hardware import HardwareSpec, local_spec
from tunecache.costmodel import registry
from tunecache.datasets.seed import SEED_STORE


def tc(*args: str, seed: str = "off") -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess; ``seed`` is ``$TUNECACHE_SEED`` ("": the shipped seed)."""
    # A generous bound: these train real models, and CI machines may be busy.
    return subprocess.run([sys.executable, "-m", "tunecache.tuner.cli", *args],
                          capture_output=True, text=True,
                          env={**os.environ, "TUNECACHE_SEED": seed}, timeout=900)


def _spec_file(sample: Path, tmp_path: Path, **changes: str) -> str:
    """A hardware spec file: the sample's hardware, with ``changes``."""
    spec = HardwareSpec.from_json(pq.read_table(sample).column("hw_json")[0].as_py())
    path = tmp_path / f"hw-{len(changes)}.json"
    path.write_text(dataclasses.replace(spec, **changes).to_json())
    return str(path)


def _sample(tmp_path: Path) -> Path:
    """An eighth of the fixture's operators (every kind), enough for the CLI's plumbing:
    model quality is tests/test_costmodel_model.py's and the benchmark's business."""
    table = pq.read_table(FIXTURE)
    ops = sorted(set(table.column("op_id").to_pylist()))[::8]
    path = tmp_path / "sample.parquet"
    pq.write_table(table.filter(pc.is_in(table.column("op_id"), pa.array(ops))), path)
    return path


def test_train_show_eval_end_to_end(tmp_path):
    fixture_frame()  # fails loudly when the fixture is missing
    root = str(tmp_path / "store")
    sample = _sample(tmp_path)
    Store(root).append(pq.read_table(sample))

    here = _spec_file(sample, tmp_path)
    empty = tc("model", "show", "--root", root, "--hardware", here, "--json")
    assert empty.returncode == 0, empty.stderr
    assert json.loads(empty.stdout) == {"current": None, "source": None,
                                        "hw_id": HardwareSpec.from_file(here).hw_id,
                                        "store_current": None, "stored": []}

    trained = tc("model", "train", "--root", root, "--folds", "2", "--json")
    assert trained.returncode == 0, trained.stderr
    info = json.loads(trained.stdout)
    version = info["model_version"]
    assert info["current"] and info["training"]["groups"] >= 2
    assert info["metrics"]["model"]["top5"] > 0

    shown = tc("model", "show", "--root", root, "--hardware", here, "--json")
    assert shown.returncode == 0, shown.stderr
    meta = json.loads(shown.stdout)
    assert meta["current"]["model_version"] == version and meta["stored"] == [version]
    assert meta["source"] == "trained" and meta["store_current"] == version
    human = tc("model", "show", "--root", root, "--hardware", here)
    assert version in human.stdout and "feature version" in human.stdout
    assert "trained on this store's records" in human.stdout
    # On hardware it was not trained on (one machine's data: no transfer), compiles rank
    # with the shipped seed's model, and show says so.
    if SEED_STORE.is_dir():
        other = _spec_file(sample, tmp_path, cpu_model="Never measured")
        elsewhere = tc("model", "show", "--root", root, "--hardware", other, "--json", seed="")
        assert elsewhere.returncode == 0, elsewhere.stderr
        shown_there = json.loads(elsewhere.stdout)
        assert shown_there["source"] == "seed" and shown_there["store_current"] == version
        assert shown_there["current"]["model_version"] == registry.current_version(SEED_STORE)
        human = tc("model", "show", "--root", root, "--hardware", other, seed="")
        assert f"the store's current model {version} is not used" in human.stdout

    evaluated = tc("model", "eval", "--data", str(sample), "--model", "current", "--root", root,
                   "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads(evaluated.stdout)
    assert report["split"] == "given data"
    assert {"top1", "top5", "pairwise", "spearman"} <= set(report["model"])

    out = tmp_path / "copy"
    saved = tc("model", "train", "--root", root, "--folds", "0", "--out", str(out), "--json")
    assert saved.returncode == 0, saved.stderr
    assert json.loads(saved.stdout)["current"] is False and (out / "meta.json").exists()
    from_dir = tc("model", "show", "--model", str(out))
    assert from_dir.returncode == 0 and "model f" in from_dir.stdout


@pytest.mark.skipif(not SEED_STORE.is_dir(), reason="no seed shipped in this checkout")
def test_a_fresh_store_shows_the_seed_model(tmp_path, monkeypatch):
    """A fresh install ranks its compiles with the shipped seed's model: show names it."""
    fresh = str(tmp_path / "fresh")
    seed_version = registry.current_version(SEED_STORE)
    shown = tc("model", "show", "--root", fresh, "--json", seed="")
    assert shown.returncode == 0, shown.stderr
    meta = json.loads(shown.stdout)
    assert meta["source"] == "seed" and meta["current"]["model_version"] == seed_version
    assert meta["store_current"] is None and meta["stored"] == []
    human = tc("model", "show", "--root", fresh, seed="")
    assert human.returncode == 0, human.stderr
    assert f"model {seed_version} (the shipped seed's model" in human.stdout
    assert "no current model" not in human.stdout
    # Compiles find their model through the same function (registry.load_serving).
    monkeypatch.setenv("TUNECACHE_SEED", "")
    found = registry.find_serving(fresh, local_spec())
    assert found is not None and (found.source, found.model.version) == ("seed", seed_version)
    served = registry.load_serving(fresh, local_spec())
    assert served is not None and served.version == seed_version


def test_cross_validated_eval_and_plot(tmp_path):
    fixture_frame()
    png = tmp_path / "scatter.png"
    result = tc("model", "eval", "--data", str(_sample(tmp_path)), "--folds", "2", "--png",
                str(png))
    if importlib.util.find_spec("matplotlib") is None:
        assert result.returncode == 2 and "tunecache[plots]" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    assert "by operator" in result.stdout and "analytic" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_user_errors_are_one_line(tmp_path):
    nothing = tc("model", "train", "--root", str(tmp_path / "empty"))
    assert nothing.returncode == 2
    assert nothing.stderr.startswith("error: no measurement records")
    assert "Traceback" not in nothing.stderr

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.json").write_text("{}")
    (broken / "meta.json").write_text("{not json")
    refused = tc("model", "show", "--model", str(broken))
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: ") and "meta.json" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    no_model = tc("model", "eval", "--data", str(FIXTURE), "--model", "current",
                  "--root", str(tmp_path / "empty"))
    assert no_model.returncode == 2 and "no current model" in no_model.stderr
