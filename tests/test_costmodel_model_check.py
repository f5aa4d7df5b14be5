"""A cost model from a shared store is checked before XGBoost reads it (issue 55): trees
whose child or feature indices XGBoost would follow out of bounds (SIGSEGV in ``predict``)
are refused with :class:`ModelLoadError`, by ``load`` and by ``cache verify``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tunecache.costmodel import features as F
from tunecache.costmodel.model import CostModel, ModelLoadError
from tunecache.costmodel.model_check import model_problems

pytestmark = pytest.mark.fault

SEED = Path(__file__).resolve().parent.parent / "datasets" / "seed" / "store"


def _seed_model_dir() -> Path:
    version = json.loads((SEED / "models" / "CURRENT").read_text())["model_version"]
    return SEED / "models" / version


def _tree(data: dict[str, Any]) -> dict[str, Any]:
    return data["learner"]["gradient_booster"]["model"]["trees"][0]  # type: ignore[no-any-return]


def _set(name: str, value: object) -> Callable[[dict[str, Any]], None]:
    return lambda data: _tree(data)[name].__setitem__(0, value)


DAMAGE: dict[str, Callable[[dict[str, Any]], None]] = {
    "child out of range": _set("left_children", 10 ** 6),  # SIGSEGV in xgboost 3.x
    "node its own child": _set("left_children", 0),
    "negative child": _set("right_children", -5),
    "feature out of range": _set("split_indices", 10 ** 5),
    "short array": lambda data: _tree(data)["parents"].pop(),
    "tree count": lambda data: data["learner"]["gradient_booster"]["model"]["trees"].pop(),
}


def _damaged_copy(tmp_path: Path, damage: Callable[[dict[str, Any]], None]) -> Path:
    """The seed model directory with ``damage`` done to model.json and meta.json's hash
    updated to match (what a writer to the store can do)."""
    out = tmp_path / "model"
    shutil.copytree(_seed_model_dir(), out)
    data = json.loads((out / "model.json").read_bytes())
    damage(data)
    model = json.dumps(data).encode()
    (out / "model.json").write_bytes(model)
    meta = json.loads((out / "meta.json").read_text())
    meta["model_sha256"] = hashlib.sha256(model).hexdigest()
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def test_the_shipped_model_passes() -> None:
    data = json.loads((_seed_model_dir() / "model.json").read_bytes())
    assert model_problems(data, len(F.FEATURE_NAMES)) == []


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_trees_are_refused_before_xgboost(tmp_path: Path, damage: str) -> None:
    with pytest.raises(ModelLoadError, match=r"model\.json is malformed"):
        CostModel.load(_damaged_copy(tmp_path, DAMAGE[damage]))


def test_cache_verify_reports_a_model_that_would_crash_predict(tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(SEED, store)
    version = _seed_model_dir().name
    damaged = _damaged_copy(tmp_path, DAMAGE["child out of range"])
    for name in ("model.json", "meta.json"):
        shutil.copy(damaged / name, store / "models" / version / name)
    out = subprocess.run([sys.executable, "-m", "tunecache.tuner.cli", "cache", "verify",
                          "--root", str(store)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ))
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert "malformed" in out.stdout + out.stderr


def test_a_model_file_that_is_not_json_is_refused_before_xgboost(tmp_path: Path) -> None:
    out = tmp_path / "model"
    shutil.copytree(_seed_model_dir(), out)
    model = b"\x00\x01 not json"
    (out / "model.json").write_bytes(model)
    meta = json.loads((out / "meta.json").read_text())
    meta["model_sha256"] = hashlib.sha256(model).hexdigest()
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ModelLoadError, match=r"model\.json is not JSON"):
        CostModel.load(out)
