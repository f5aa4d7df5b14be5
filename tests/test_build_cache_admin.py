"""``tunecache build-cache``: counting what the build cache holds and pruning it by age and
size, with real kernels, a real precompiled header, and kernels rebuilt after pruning."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tunecache.compiler.backends.cpu import artifacts
from tunecache.compiler.backends.cpu.build import build
from tunecache.compiler.codegen import generate
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import load_kernel, random_inputs, reference
from tunecache.compiler.schedule import default_schedule
from tunecache.tuner.cli import main

HW = local_spec()
OPS = [matmul_op(24, 40, 16, epilogue=e) for e in ("bias", "relu", "bias+relu")]
DAY = 86400.0


def _build(op: OpSignature, cache: Path) -> Path:
    return build(generate(op, default_schedule(op, HW), HW), cache_dir=cache).path


def _runs(op: OpSignature, cache: Path) -> None:
    inputs = random_inputs(op, seed=2)
    got = load_kernel(op, build(generate(op, default_schedule(op, HW), HW),
                                cache_dir=cache))(*inputs)
    np.testing.assert_allclose(got, reference(op, inputs), rtol=1e-4, atol=1e-4)


def _age(path: Path, days: float) -> None:
    then = time.time() - days * DAY
    os.utime(path, (then, then))


def _cli(*args: str) -> dict:
    result = CliRunner().invoke(main, ["build-cache", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.fixture
def cache(tmp_path: Path) -> tuple[Path, list[Path]]:
    root = tmp_path / "kernels"
    objects = [_build(op, root) for op in OPS]
    _age(objects[0], 30)
    _age(objects[1], 10)
    return root, objects


def test_stats_count_kernels_and_headers(cache: tuple[Path, list[Path]]) -> None:
    root, objects = cache
    stats = _cli("stats", "--dir", str(root))
    assert stats["entries"]["kernel"] == 3
    assert stats["bytes"]["kernel"] >= sum(p.stat().st_size for p in objects)
    assert stats["entries"]["header"] == len(list((root / "pch").glob("*/tc_includes.h.gch")))
    assert stats["oldest"] < stats["newest"]


def test_prune_by_age_keeps_the_young_and_a_pruned_kernel_comes_back(
        cache: tuple[Path, list[Path]]) -> None:
    root, objects = cache
    dry = _cli("prune", "--dir", str(root), "--keep-days", "5", "--dry-run")
    assert dry["removed"]["kernel"] == 2 and all(p.exists() for p in objects)
    done = _cli("prune", "--dir", str(root), "--keep-days", "5")
    assert done["removed"] == dry["removed"] and done["bytes"] == dry["bytes"] > 0
    assert not objects[0].exists() and not objects[1].exists() and objects[2].exists()
    assert not objects[0].with_suffix(".json").exists()
    for op in OPS:
        _runs(op, root)
    assert _cli("stats", "--dir", str(root))["entries"]["kernel"] == 3


def test_prune_to_a_size_goes_oldest_first(cache: tuple[Path, list[Path]]) -> None:
    root, objects = cache
    for gch in (root / "pch").glob("*/tc_includes.h.gch"):
        _age(gch, 1)
    found = artifacts.entries(root)
    kernels = [e for e in found if e.kind == "kernel"]
    assert [e.paths[1] for e in kernels] == objects  # oldest first
    headers = sum(e.bytes for e in found if e.kind == "header")
    budget = headers + kernels[2].bytes  # room for the newest kernel and the headers
    doomed = artifacts.prunable(found, time.time(), max_bytes=budget)
    assert [e.paths[1] for e in doomed] == objects[:2]


def test_dead_builds_files_go_and_live_ones_stay(cache: tuple[Path, list[Path]]) -> None:
    root, objects = cache
    folder = objects[2].parent
    dead, live = folder / ".dead.so.tmp", folder / ".live.so.tmp"
    dead.write_bytes(b"x" * 100)
    live.write_bytes(b"y" * 100)
    _age(dead, 1)
    done = _cli("prune", "--dir", str(root))
    assert done["removed"] == {"kernel": 0, "header": 0, "stray": 1}
    assert not dead.exists() and live.exists() and all(p.exists() for p in objects)


def test_an_empty_or_missing_cache_is_no_error(tmp_path: Path) -> None:
    stats = _cli("stats", "--dir", str(tmp_path / "none"))
    assert stats["entries"] == {"kernel": 0, "header": 0, "stray": 0}
    assert stats["oldest"] is None
    assert _cli("prune", "--dir", str(tmp_path / "none"), "--max-mib", "0")["bytes"] == 0
