"""Deploy-time compilation against the cache: decisions, wanted list, warm compiles, CLI."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_support import Builder, assert_close, bert_layer_model, ort_run, random_feeds, resnet_model

from tunecache.cache.store import Store
from tunecache.cache.wanted import load_wanted
from tunecache.compiler.backends.cpu.build import find_compiler
from tunecache.compiler.hardware import local_spec
from tunecache.datasets.suites import Workload
from tunecache.tuner.deploy import compile_model
from tunecache.tuner.jobs import JobOptions, run_job
from tunecache.tuner.measure import Runner, TimingConfig

HW = local_spec()


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "resnet.onnx"
    onnx.save(resnet_model(), path)
    return path


def check_against_ort(path: Path, compiled) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(path)
    feeds = random_feeds(model)
    ours = compiled.run(feeds)
    theirs = ort_run(model, feeds)
    for (name, value), ref in zip(ours.items(), theirs, strict=True):
        np.testing.assert_allclose(value, ref, rtol=1e-4, atol=1e-4, err_msg=name)


def test_misses_are_guessed_recorded_as_wanted_and_correct(resnet: Path, tmp_path: Path) -> None:
    store = Store(tmp_path)
    compiled = compile_model(resnet, store=store, policy="analytic")
    assert compiled.plan and all(e.action == "guess" for e in compiled.plan)
    assert all("cache miss" in e.reason for e in compiled.plan)
    check_against_ort(resnet, compiled)
    wanted = load_wanted(store.location, HW.hw_id)
    planned: dict[str, int] = {}
    for e in compiled.plan:
        planned[e.op.text] = planned.get(e.op.text, 0) + 1
    assert {w.op.text: w.count for w in wanted} == planned


def test_cache_only_runs_numpy_and_is_still_correct(resnet: Path, tmp_path: Path) -> None:
    compiled = compile_model(resnet, store=Store(tmp_path), policy="cache-only")
    assert {e.action for e in compiled.plan} == {"numpy"}
    check_against_ort(resnet, compiled)


def test_tuned_ops_hit_and_warm_compile_runs_no_compiler(resnet: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(tmp_path / "store")
    graph_ops = {e.op for e in compile_model(resnet, store=store, policy="cache-only").plan}
    with Runner(HW, TimingConfig(min_time_s=0.01, min_repeats=3)) as runner:
        run_job([Workload(op, 1, "t") for op in graph_ops], HW, store,
                JobOptions(trials=2, refine=False, baseline=False), runner=runner)
    store.publish(HW.hw_id)
    cold = compile_model(resnet, store=store, policy="balanced")
    assert {e.action for e in cold.plan} == {"cache"}
    assert all("measured" in e.reason for e in cold.plan)
    check_against_ort(resnet, cold)
    # Warm: every kernel built already; a compiler that logs its calls must not be called.
    log = tmp_path / "cc.log"
    wrapper = tmp_path / "cc"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {find_compiler().path} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(wrapper))
    from tunecache.compiler.backends.cpu import build

    build.probe_compiler.cache_clear()
    warm = compile_model(resnet, store=store, policy="balanced")
    calls = [line for line in (log.read_text().splitlines() if log.exists() else [])
             if " -o " in f" {line} "]
    assert calls == []
    assert warm.timings["total_s"] < 2.0
    assert [e.schedule for e in warm.plan] == [e.schedule for e in cold.plan]


def test_bert_layer_compiles_and_matches(tmp_path: Path) -> None:
    path = tmp_path / "bert.onnx"
    onnx.save(bert_layer_model(), path)
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic")
    kinds = {e.op.kind for e in compiled.plan}
    # projections as matmuls; scores, mask, softmax and context as one fused attention
    assert "matmul" in kinds and "attention" in kinds and "batch_matmul" not in kinds
    check_against_ort(path, compiled)


def tunecache(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache.tuner.cli", *args],
                          capture_output=True, text=True, timeout=300)


def test_cli_compile_and_run(resnet: Path, tmp_path: Path) -> None:
    out = tunecache("compile", str(resnet), "--root", str(tmp_path), "--policy", "analytic",
                    "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["kernel_nodes"] == len(plan["plan"]) and plan["actions"] == {"guess": len(plan["plan"])}
    assert all(e["reason"] and e["op"] for e in plan["plan"])
    text = tunecache("compile", str(resnet), "--root", str(tmp_path))
    assert "decisions:" in text.stdout
    run = tunecache("run", str(resnet), "--root", str(tmp_path), "--policy", "analytic",
                    "--compare", "onnxruntime", "--repeat", "3", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["latency_ratio"] > 0
    assert all(e["max_abs"] < 1e-3 for e in report["onnxruntime"]["errors"].values())


def test_cli_run_profile(resnet: Path, tmp_path: Path) -> None:
    """``run --profile``: where the time goes, as text and as JSON (every step)."""
    args = ("run", str(resnet), "--root", str(tmp_path), "--policy", "analytic",
            "--repeat", "2", "--profile")
    report = json.loads(tunecache(*args, "--json").stdout)["profile"]
    assert report["runs"] == 2 and report["steps"]
    assert {s["where"] for s in report["steps"]} <= {"kernel", "copy", "numpy"}
    assert {s["op"] for s in report["steps"]} >= {"conv2d", "matmul"}
    assert sum(report["by_where_ms"].values()) == pytest.approx(
        sum(s["ms"] for s in report["steps"]))
    text = tunecache(*args[:-1], "--profile", "3")
    assert text.returncode == 0, text.stderr
    assert "slowest 3 steps:" in text.stdout and "conv2d" in text.stdout
    listed = text.stdout.split("slowest 3 steps:")[1].strip().splitlines()
    assert len(listed) == 3


def test_cli_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    for args, fragment in [(("compile", str(tmp_path / "missing.onnx")), "does not exist"),
                           (("compile", str(bad)), "bad.onnx"),
                           (("compile", str(bad), "--input-shape", "x=1,a"), "--input-shape")]:
        out = tunecache(*args, "--root", str(tmp_path))
        assert out.returncode == 2, (args, out.stderr)
        assert fragment in out.stderr and "Traceback" not in out.stderr


def test_threads_bound_every_kernel_of_a_compiled_model(tmp_path: Path) -> None:
    b = Builder(13)
    x = b.input("x", [256, 256])
    y = b.node("Relu", [b.node("MatMul", [x, b.weight(256, 256)])])
    model = b.model([y, b.node("MaxPool", [b.input("image", [1, 8, 64, 64])],
                                           kernel_shape=[2, 2], strides=[2, 2])])
    path = tmp_path / "two.onnx"
    onnx.save(model, str(path))
    wide = replace(HW, cores=4)  # the tiler proposes 4 threads for these; the run allows 1
    unbounded = compile_model(path, store=Store(tmp_path / "store"), policy="analytic",
                              hw=wide, record_wanted=False)
    assert max(e.schedule.threads for e in unbounded.plan if e.schedule) > 1
    compiled = compile_model(path, store=Store(tmp_path / "store"), policy="analytic",
                             hw=wide, threads=1, record_wanted=False)
    schedules = [e.schedule for e in compiled.plan if e.schedule is not None]
    assert len(schedules) == len(compiled.plan) and {s.threads for s in schedules} == {1}
    feeds = random_feeds(model)
    assert_close(compiled.run(feeds), ort_run(model, feeds), [o.name for o in model.graph.output])
