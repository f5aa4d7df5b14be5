"""Serving across machines: the exact hardware first, then the nearest tuned one, then the seed.

Real stores on disk (records appended, snapshots published), real compiles and kernels.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_support import mlp_model, ort_run, random_feeds

from tunecache.cache import paths
from tunecache.cache.nearest import CacheView, published_specs
from tunecache.cache.store import Store
from tunecache.cache.wanted import load_wanted
from tunecache.compiler.backends.cpu.build import find_compiler
from tunecache.compiler.hardware import HardwareSpec, local_spec
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule, problems
from tunecache.costmodel.analytic import estimate
from tunecache.datasets.records import Record
from tunecache.tuner.deploy import compile_model
from tunecache.tuner.deploy.policy import Policy, PolicyConfig
from tunecache.tuner.search import roller
from tunecache.tuner.search.refit import Nearest, refit

LOCAL = local_spec()
# Another VM of the same kind (only the model string differs), a bigger sibling, and a
# machine of a higher ISA level than this one's, whose code would not run here.
SIBLING = dataclasses.replace(LOCAL, cpu_model=LOCAL.cpu_model + " (other VM)")
BIGGER = dataclasses.replace(LOCAL, cores=LOCAL.cores * 2, l2_bytes=LOCAL.l2_bytes * 2,
                             cpu_model="Bigger CPU")
OTHER_ARCH = dataclasses.replace(LOCAL, arch="aarch64", isa="generic", vector_bits=128,
                                 cpu_model="Arm CPU")
COMPILER = find_compiler().identity
OP = matmul_op(256, 256, 256)


def record(op: OpSignature, schedule: Schedule, median: float, hw: HardwareSpec) -> Record:
    return Record.create(op=op, hw=hw, schedule=schedule, status="ok", median_s=median,
                         runtimes_s=[median], compiler=COMPILER)


def tuned(op: OpSignature, hw: HardwareSpec) -> Schedule:
    """The tiler's top-1 for ``op`` on ``hw``, with every core: what a tune there keeps."""
    return roller.candidates(op, hw, k=1)[0].schedule.replace(threads=hw.cores)


def publish(root: Path, *rows: Record) -> Store:
    store = Store(root)
    store.append(list(rows))
    assert all(r.changed and not r.refused for r in store.publish())
    return store


def test_publish_keeps_each_hardware_spec_and_forgeries_are_ignored(tmp_path: Path) -> None:
    store = publish(tmp_path, record(OP, tuned(OP, LOCAL), 1e-3, LOCAL),
                    record(OP, tuned(OP, SIBLING), 1e-3, SIBLING))
    specs = {s.hw_id: s for s in published_specs(store.location)}
    assert specs == {LOCAL.hw_id: LOCAL, SIBLING.hw_id: SIBLING}
    # A spec edited after publishing no longer hashes to its directory: never a neighbour.
    forged = dataclasses.replace(SIBLING, cores=64).to_json()
    (tmp_path / paths.hardware_path(SIBLING.hw_id)).write_text(forged)
    (tmp_path / paths.hardware_path(LOCAL.hw_id)).write_text("{not json")
    assert published_specs(store.location) == []


def test_exact_first_then_the_nearest_then_nothing_whose_code_cannot_run(tmp_path: Path) -> None:
    only_sibling = matmul_op(128, 256, 64)
    only_bigger = matmul_op(64, 128, 256)
    only_foreign = matmul_op(32, 64, 64)
    store = publish(
        tmp_path,
        record(OP, tuned(OP, LOCAL), 2e-3, LOCAL),
        record(OP, tuned(OP, SIBLING), 1e-3, SIBLING),  # faster, but not measured here
        record(only_sibling, tuned(only_sibling, SIBLING), 1e-4, SIBLING),
        record(only_sibling, tuned(only_sibling, BIGGER), 5e-5, BIGGER),
        record(only_bigger, tuned(only_bigger, BIGGER), 1e-4, BIGGER),
        record(only_foreign, MatmulSchedule(mr=4, nr=4, kc=64, mc=32, nc=64), 1e-5, OTHER_ARCH),
    )
    view = CacheView([(store.location, "store")], LOCAL, COMPILER)
    exact = view.lookup(OP)
    assert exact is not None and exact.exact and exact.hw_id == LOCAL.hw_id
    assert exact.entry.median_s == pytest.approx(2e-3)
    near = view.lookup(only_sibling)
    assert near is not None and near.hw_id == SIBLING.hw_id and 0 < near.distance < 1
    assert near.provenance() == {"kind": "nearest", "hw_id": SIBLING.hw_id,
                                 "distance": round(near.distance, 3), "store": "store"}
    far = view.lookup(only_bigger)
    assert far is not None and far.hw_id == BIGGER.hw_id and far.distance > near.distance
    assert view.lookup(only_foreign) is None
    assert [hw for hw, _, _ in view.neighbours()] == [SIBLING.hw_id, BIGGER.hw_id]
    assert CacheView([(store.location, "store")], LOCAL, COMPILER, neighbours=False,
                     shapes=False).lookup(only_sibling) is None
    # Without hardware neighbours, this hardware's nearest tuned shape is what is left.
    alone = CacheView([(store.location, "store")], LOCAL, COMPILER,
                      neighbours=False).lookup(only_sibling)
    assert alone is not None and alone.hw_id == LOCAL.hw_id and alone.shape_from == OP.text


def test_a_neighbours_schedule_is_refitted_to_the_local_cores() -> None:
    schedule = tuned(OP, BIGGER)
    assert schedule.threads == BIGGER.cores > LOCAL.cores
    fitted = refit(OP, schedule, LOCAL, tuned_cores=BIGGER.cores)
    assert fitted is not None and fitted.threads == LOCAL.cores
    assert not problems(OP, fitted, LOCAL)
    rethreaded = schedule.replace(threads=LOCAL.cores)
    assert estimate(OP, fitted, LOCAL).seconds <= estimate(OP, rethreaded, LOCAL).seconds
    one = schedule.replace(threads=1)
    assert refit(OP, one, LOCAL, tuned_cores=BIGGER.cores) == one  # chosen, not "all cores"
    # Same cores as where it was tuned: served exactly as measured.
    assert refit(OP, rethreaded, LOCAL, tuned_cores=LOCAL.cores) == rethreaded


@pytest.mark.skipif(LOCAL.cores < 2, reason="needs two cores to split across")
def test_a_split_that_no_longer_fits_the_threads_is_mended() -> None:
    # Measured on a one-core neighbour: M=128 as one 128-row panel, split over rows. With
    # two threads that is one panel for two threads; the re-fit splits it.
    op = matmul_op(128, 768, 768, epilogue="bias")
    one_core = MatmulSchedule(mr=4, nr=2 * LOCAL.lanes, kc=384, mc=128, nc=768, parallel="m",
                              threads=1)
    assert not problems(op, one_core, dataclasses.replace(LOCAL, cores=1))
    fitted = refit(op, one_core, LOCAL, tuned_cores=1)
    assert fitted is not None and fitted.threads == LOCAL.cores
    assert fitted != one_core.replace(threads=LOCAL.cores)
    assert estimate(op, fitted, LOCAL).seconds * 1.1 < \
        estimate(op, one_core.replace(threads=LOCAL.cores), LOCAL).seconds
    illegal = MatmulSchedule(mr=1000, nr=16, kc=256, mc=1000, nc=1024)
    assert refit(OP, illegal, LOCAL, tuned_cores=LOCAL.cores) is None


@pytest.mark.parametrize(("policy", "action", "source"), [
    ("balanced", "guess", "nearest"), ("analytic", "guess", "tiler"),
    ("cache-only", "numpy", "numpy"),
])
def test_policies_weigh_the_nearest_offer(policy: str, action: str, source: str) -> None:
    offer = Nearest(tuned(OP, BIGGER), 1e-3, BIGGER.hw_id, 2.5, BIGGER.cores)
    decision = Policy(PolicyConfig(policy, expected_calls=1), LOCAL).decide(
        OP, None, nearest=offer)
    assert (decision.action, decision.source) == (action, source)
    if source == "nearest":
        assert decision.schedule is not None and decision.schedule.threads == LOCAL.cores
        assert BIGGER.hw_id in decision.reason and "distance 2.50" in decision.reason


def _mlp(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), path)
    return path


def test_a_compile_with_only_a_neighbours_records_serves_them_and_says_so(
        tmp_path: Path) -> None:
    model = _mlp(tmp_path)
    ops = {e.op for e in compile_model(model, store=Store(tmp_path / "empty"),
                                       policy="analytic", record_wanted=False).plan}
    store = publish(tmp_path / "store", *(record(op, tuned(op, BIGGER), 1e-5, BIGGER)
                                          for op in ops))
    compiled = compile_model(model, store=store, policy="balanced", use_model=False)
    assert {(e.action, e.source) for e in compiled.plan} == {("guess", "nearest")}
    for entry in compiled.plan:
        assert entry.served_from is not None
        assert entry.served_from["kind"] == "nearest"
        assert entry.served_from["hw_id"] == BIGGER.hw_id
        assert entry.schedule is not None and entry.schedule.threads <= LOCAL.cores
    feeds = random_feeds(onnx.load(model))
    for value, ref in zip(compiled.run(feeds).values(), ort_run(onnx.load(model), feeds),
                          strict=True):
        np.testing.assert_allclose(value, ref, rtol=1e-4, atol=1e-5)
    # Served from a neighbour is still a miss for this hardware: the nightly job tunes it.
    assert {w.op for w in load_wanted(store.location, LOCAL.hw_id)} == ops


def test_cli_compile_json_names_where_each_schedule_came_from(tmp_path: Path) -> None:
    model = _mlp(tmp_path)
    ops = {e.op for e in compile_model(model, store=Store(tmp_path / "empty"),
                                       policy="analytic", record_wanted=False).plan}
    first, *rest = sorted(ops, key=lambda op: op.text)
    publish(tmp_path / "store", record(first, tuned(first, LOCAL), 1e-5, LOCAL),
            *(record(op, tuned(op, SIBLING), 1e-5, SIBLING) for op in rest))
    done = subprocess.run(
        [sys.executable, "-m", "tunecache.tuner.cli", "compile", str(model), "--root",
         str(tmp_path / "store"), "--json"],
        capture_output=True, text=True, timeout=300, env={**os.environ})
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)["plan"]
    served = {p["op"]: p["served_from"] for p in plan}
    assert served[first.text]["kind"] == "exact"
    assert served[first.text]["distance"] == 0.0
    assert {served[op.text]["kind"] for op in rest} == {"nearest"}
    assert {served[op.text]["hw_id"] for op in rest} == {SIBLING.hw_id}
    assert json.loads(done.stdout)["served"] == {"exact (store)": 1,
                                                 "nearest (store)": len(plan) - 1}
    text = subprocess.run(
        [sys.executable, "-m", "tunecache.tuner.cli", "compile", str(model), "--root",
         str(tmp_path / "store")], capture_output=True, text=True, timeout=300,
        env={**os.environ})
    assert f"schedules: {len(plan) - 1} nearest (store), 1 exact (store)" in text.stdout


def test_the_seed_store_is_the_last_resort_and_can_be_turned_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _mlp(tmp_path)
    ops = {e.op for e in compile_model(model, store=Store(tmp_path / "empty"),
                                       policy="analytic", record_wanted=False).plan}
    publish(tmp_path / "seed", *(record(op, tuned(op, SIBLING), 1e-5, SIBLING) for op in ops))
    monkeypatch.setenv("TUNECACHE_SEED", str(tmp_path / "seed"))
    compiled = compile_model(model, store=Store(tmp_path / "mine"), policy="balanced",
                             use_model=False, record_wanted=False)
    assert {(e.source, (e.served_from or {}).get("store")) for e in compiled.plan} == \
        {("nearest", "seed")}
    monkeypatch.setenv("TUNECACHE_SEED", "off")
    compiled = compile_model(model, store=Store(tmp_path / "mine"), policy="balanced",
                             use_model=False, record_wanted=False)
    assert all(e.served_from is None for e in compiled.plan)


def test_an_offered_schedule_is_measured_first_within_the_trials() -> None:
    from test_tuner_faults import SimulatedRunner

    from tunecache.tuner.search import TuneConfig, tune_op

    offered = refit(OP, tuned(OP, BIGGER), LOCAL, tuned_cores=BIGGER.cores)
    assert offered is not None
    runner = SimulatedRunner(cost_s=0.01)
    result = tune_op(OP, LOCAL, runner, config=TuneConfig(trials=3, refine=False),  # type: ignore[arg-type]
                     clock=runner.clock, first=[offered])
    assert len(result.results) == 3
    assert result.results[0].schedule == offered
    assert result.results[0].source == "offered"
    ids = [r.schedule.schedule_id for r in result.results if r.schedule is not None]
    assert len(set(ids)) == 3  # the offer is not measured twice when the tiler ranks it too


def test_a_nightly_job_starts_an_op_from_the_nearest_hardwares_schedule(tmp_path: Path) -> None:
    from test_tuner_faults import SimulatedRunner

    from tunecache.datasets.suites import Workload
    from tunecache.tuner.jobs import JobOptions, run_job

    store = publish(tmp_path, record(OP, tuned(OP, BIGGER), 1e-3, BIGGER))
    offered = refit(OP, tuned(OP, BIGGER), LOCAL, tuned_cores=BIGGER.cores)
    options = JobOptions(trials=2, refine=False, baseline=False)
    runner = SimulatedRunner(cost_s=0.01)
    run_job([Workload(OP, 1, "op")], LOCAL, store, options, runner=runner)  # type: ignore[arg-type]
    mine = store.load(hw_id=LOCAL.hw_id)
    assert (mine["source"] != "confirm").sum() == 2
    first = mine.sort_values("timestamp").iloc[0]
    assert first["source"] == "offered"
    assert first["schedule_id"] == offered.schedule_id  # type: ignore[union-attr]
    # With offers turned off, the tiler's ranking starts.
    again = Store(tmp_path / "other")
    again.append(store.load(hw_id=BIGGER.hw_id))
    again.publish()
    run_job([Workload(OP, 1, "op")], LOCAL, again, dataclasses.replace(options, nearest=False),
            runner=SimulatedRunner(cost_s=0.01))  # type: ignore[arg-type]
    assert "offered" not in set(again.load(hw_id=LOCAL.hw_id)["source"])


def test_ops_that_differ_only_in_sizes_share_a_family() -> None:
    from tunecache.compiler.ops import shape_family

    a = shape_family(matmul_op(128, 768, 768, epilogue="bias").text)
    b = shape_family(matmul_op(64, 768, 768, epilogue="bias").text)
    c = shape_family(matmul_op(64, 768, 768).text)
    assert a is not None and b is not None and c is not None
    assert a[0] == b[0] != c[0] and (a[1], b[1]) == ((128, 768, 768), (64, 768, 768))
    s1 = conv2d_op(1, 64, 56, 56, 64, 3, 3, stride=1, pads=1)
    s2 = conv2d_op(1, 64, 56, 56, 64, 3, 3, stride=2, pads=1)
    assert shape_family(s1.text)[0] != shape_family(s2.text)[0]  # type: ignore[index]
    assert shape_family("matmul(M=x,N=1,K=1)") is None
    assert shape_family("nonsense") is None


def test_an_untuned_shape_is_served_the_nearest_tuned_shape_after_other_hardware(
        tmp_path: Path) -> None:
    seq128 = matmul_op(128, 768, 768, epilogue="bias")
    seq512 = matmul_op(512, 768, 768, epilogue="bias")
    seq96 = matmul_op(96, 768, 768, epilogue="bias")
    other_kind = matmul_op(96, 768, 768)
    on_sibling = matmul_op(80, 768, 768, epilogue="bias")
    store = publish(tmp_path, record(seq128, tuned(seq128, LOCAL), 1e-3, LOCAL),
                    record(seq512, tuned(seq512, LOCAL), 4e-3, LOCAL),
                    record(on_sibling, tuned(on_sibling, SIBLING), 1e-3, SIBLING))
    view = CacheView([(store.location, "store")], LOCAL, COMPILER)
    served = view.lookup(seq96)
    assert served is not None and served.shape_from == seq128.text
    assert served.provenance()["kind"] == "nearest_shape"
    assert served.provenance()["shape_distance"] == pytest.approx(math.log2(128 / 96), abs=1e-3)
    assert not served.exact and served.hw_id == LOCAL.hw_id
    # Another hardware with the op itself comes first; another family is never offered.
    near = view.lookup(on_sibling)
    assert near is not None and near.hw_id == SIBLING.hw_id and near.shape_from is None
    assert view.lookup(matmul_op(96, 768, 768, epilogue="bias+relu")) is None
    assert view.lookup(other_kind) is None
    assert CacheView([(store.location, "store")], LOCAL, COMPILER, shapes=False).lookup(
        seq96) is None
    decision = Policy(PolicyConfig("balanced", expected_calls=1), LOCAL).decide(
        seq96, None, nearest=Nearest(served.entry.schedule, served.entry.median_s,
                                     served.hw_id, 0.0, LOCAL.cores, served.shape_from))
    assert decision.source == "nearest" and "nearest tuned shape" in decision.reason
    assert decision.schedule is not None and not problems(seq96, decision.schedule, LOCAL)


def test_a_dynamic_model_runs_a_new_shape_from_its_tuned_shape(tmp_path: Path) -> None:
    from test_frontend_exporters import DATA, exporter_feeds

    gpt2 = DATA / "gpt2_torchscript17.onnx"
    compiled = compile_model(gpt2, store=Store(tmp_path / "empty"), policy="analytic",
                             record_wanted=False, input_shapes={"input_ids": (1, 8)})
    store = publish(tmp_path / "store", *(record(e.op, e.schedule, 1e-4, LOCAL)
                                          for e in compiled.plan if e.schedule is not None))
    dynamic = compile_model(gpt2, store=store, policy="balanced", use_model=False)
    assert dynamic.info is not None
    planned = dynamic.prepare({"input_ids": (1, 6)})
    kinds = {(e.served_from or {}).get("kind") for e in planned.plan}
    assert "nearest_shape" in kinds and "exact" not in kinds
    assert all(e.source == "nearest" for e in planned.plan
               if (e.served_from or {}).get("kind") == "nearest_shape")
    feeds = exporter_feeds(dynamic.info, 1, 6)
    reference = ort_run(onnx.load(str(gpt2)), feeds)
    np.testing.assert_allclose(dynamic.run(feeds)["logits"], reference[0], rtol=1e-4, atol=1e-4)
    # The shape that ran is wanted in its own right for the nightly job.
    assert {w.op for w in load_wanted(store.location, LOCAL.hw_id)} >= \
        {e.op for e in planned.plan if e.source == "nearest"}


def test_a_nightly_job_measures_the_seeds_own_entry_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The seed holds a measured entry for this very hardware: a job into a fresh store
    measures it first, so a few trials can only improve on what an untuned compile gets;
    an entry of the job's own store is not offered again."""
    from test_tuner_faults import SimulatedRunner

    from tunecache.datasets.suites import Workload
    from tunecache.tuner.jobs import JobOptions, run_job

    mine = tuned(OP, LOCAL)
    publish(tmp_path / "seed", record(OP, mine, 1e-3, LOCAL))
    monkeypatch.setenv("TUNECACHE_SEED", str(tmp_path / "seed"))
    store = Store(tmp_path / "fresh")
    options = JobOptions(trials=2, refine=False, baseline=False)
    run_job([Workload(OP, 1, "op")], LOCAL, store, options,
            runner=SimulatedRunner(cost_s=0.01))  # type: ignore[arg-type]
    first = store.load(hw_id=LOCAL.hw_id).sort_values("timestamp").iloc[0]
    assert (first["source"], first["schedule_id"]) == ("offered", mine.schedule_id)
    store.publish()
    run_job([Workload(OP, 1, "op")], LOCAL, store, dataclasses.replace(options, retune=True),
            runner=SimulatedRunner(cost_s=0.01))  # type: ignore[arg-type]
    assert list(store.load(hw_id=LOCAL.hw_id)["source"]).count("offered") == 1
