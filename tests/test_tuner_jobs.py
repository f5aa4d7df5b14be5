"""Nightly jobs end to end: real kernels, real store, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tunecache.cache.store import Store
from tunecache.cache.wanted import add_wanted
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.ops import OpSignature
from tunecache.datasets.suites import Workload
from tunecache.tuner.jobs import JobOptions, collect_workloads, merge_workloads, run_job
from tunecache.tuner.measure import Candidate, MeasureResult, Runner, TimingConfig
from tunecache.tuner.search import TuneConfig
from tunecache.tuner.search.roller import candidates

HW = local_spec()
FAST = TimingConfig(min_time_s=0.01, min_repeats=3, timeout_s=30.0)
A = matmul_op(24, 48, 16, epilogue="bias+relu")
B = batch_matmul_op(2, 8, 16, 8, trans_b=True)
C = matmul_op(1, 64, 32)


def tunecache(*args: str, root: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache.tuner.cli", *args, "--root", str(root)],
                          capture_output=True, text=True, timeout=timeout)


def test_tunes_ops_end_to_end_and_records_everything(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with Runner(HW, FAST) as runner:
        summary = run_job([Workload(A, 3, "a"), Workload(B, 1, "b")], HW, store,
                          JobOptions(trials=3, refine=True, baseline=True), runner=runner)
    assert [o.status for o in summary.ops] == ["tuned", "tuned"]
    frame = store.load()
    assert set(frame["op_text"]) == {A.text, B.text}
    assert set(frame["job_id"]) == {summary.job_id}
    assert frame["record_id"].is_unique
    per_op = frame.groupby("op_text")["schedule_id"].nunique().to_dict()
    assert all(n >= 3 for n in per_op.values())
    assert set(frame["source"]) <= {"tiler", "refine", "model", "confirm"}
    # The six fastest of each op's trials (and the ranking's leader) race twice more: here
    # every schedule a job measured, as each op measured at most seven.
    confirm = frame["source"] == "confirm"
    repeats = frame[confirm].groupby(["op_text", "schedule_id"]).size()
    measured = frame[~confirm].groupby("op_text")["schedule_id"].agg(set)
    raced = frame[confirm].groupby("op_text")["schedule_id"].agg(set)
    assert set(repeats) == {2}
    for op_text, ids in measured.items():
        assert set(raced[op_text]) <= set(ids) and len(set(raced[op_text])) >= min(6, len(set(ids)))
    a = next(o for o in summary.ops if o.op == A)
    # No ratio from a baseline too noisy to trust (a busy machine): flagged instead.
    assert a.best_gflops and a.baseline == "numpy" and a.baseline_gflops
    assert a.ratio or a.baseline_noisy
    # The summary's best is what the index publishes: the lowest median of medians.
    fastest = frame[frame["op_text"] == A.text].groupby("schedule_id")["median_s"].median().min()
    assert a.best_gflops == pytest.approx(A.flops / fastest / 1e9)


def test_skip_and_retune(tmp_path: Path) -> None:
    store = Store(tmp_path)
    options = JobOptions(trials=2, refine=False, baseline=False)
    with Runner(HW, FAST) as runner:
        first = run_job([Workload(C, 1, "c")], HW, store, options, runner=runner)
        again = run_job([Workload(C, 1, "c")], HW, store, options, runner=runner)
        retuned = run_job([Workload(C, 1, "c")], HW, store,
                          JobOptions(trials=2, refine=False, baseline=False, retune=True),
                          runner=runner)
    assert first.ops[0].status == "tuned" and first.ops[0].trials == 2
    assert again.ops[0].status == "skipped" and "already tuned" in again.ops[0].note
    assert retuned.ops[0].status == "tuned" and retuned.ops[0].trials == 2
    frame = store.load()
    assert (frame["source"] != "confirm").sum() == 4
    assert (frame["source"] == "confirm").sum() == 8  # 2 finalists x 2 rounds, per run


class _TickingRunner:
    """A real runner on a simulated clock: each measured candidate costs one second, so the
    budget logic is checked without depending on how busy the machine is."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def measure(self, batch: list[Candidate], progress: Any = None) -> list[MeasureResult]:
        results = self.runner.measure(batch, progress=progress)
        self.now += len(batch)
        return results

    def race(self, batch: list[Candidate], progress: Any = None) -> list[MeasureResult]:
        results = self.runner.race(batch, progress=progress)
        self.now += len(batch)
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)


def test_budget_is_respected_and_split_by_benefit(tmp_path: Path) -> None:
    big = matmul_op(96, 96, 96)
    workloads = [Workload(big, 10, "big"), Workload(A, 1, "a"), Workload(C, 1, "c")]
    budget = 6.0
    with Runner(HW, FAST) as real:
        runner = _TickingRunner(real)
        summary = run_job(workloads, HW, Store(tmp_path),
                          JobOptions(budget_s=budget, trials=50, baseline=False),
                          runner=runner, clock=runner.clock)  # type: ignore[arg-type]
    batch = TuneConfig().batch
    # A batch starts only before its op's deadline, so at most one batch runs past the budget.
    assert summary.seconds <= budget + batch
    assert summary.ops[0].op == big  # heaviest first
    assert summary.ops[0].trials >= budget - batch  # and it gets nearly all the budget
    assert summary.ops[0].trials >= summary.ops[-1].trials
    assert all(o.trials < 50 for o in summary.ops)


def test_resume_after_sigkill_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    args = ["tune", "--op", A.text, "--op", B.text, "--trials", "6", "--no-refine",
            "--no-baseline", "--quiet", "--job-id", "nightly"]
    proc = subprocess.Popen([sys.executable, "-m", "tunecache.tuner.cli", *args,
                             "--root", str(tmp_path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    store = Store(tmp_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(store.fragments()) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = store.load()
    assert 3 <= len(before) < 12, "the kill should land mid-job"
    out = tunecache(*args, root=tmp_path)
    assert out.returncode == 0, out.stderr
    after = store.load()
    assert set(before["record_id"]) <= set(after["record_id"])
    assert after["record_id"].is_unique
    pairs = after[after["source"] != "confirm"][["op_text", "schedule_id"]]
    assert not pairs.duplicated().any(), "a schedule was tried twice"
    assert after.groupby("op_text")["schedule_id"].nunique().to_dict() == {A.text: 6, B.text: 6}


def test_sigterm_stops_a_job_saying_what_it_kept(tmp_path: Path) -> None:
    # A farm's scheduler preempts with SIGTERM: the job stops as on Ctrl-C, prints its
    # summary and says what it kept, rather than vanishing mid-line.
    args = ["tune", "--op", A.text, "--op", B.text, "--trials", "6", "--no-refine",
            "--no-baseline", "--job-id", "preempted"]
    proc = subprocess.Popen([sys.executable, "-m", "tunecache.tuner.cli", *args,
                             "--root", str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:  # the second op starting: the first one's records are kept
        if "[2/2] tuning" in line:
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    kept = [line for line in err.splitlines() if line.startswith("interrupted:")]
    assert len(kept) == 1 and "continues where it stopped" in kept[0], err
    assert int(kept[0].split()[1]) <= len(Store(tmp_path).load()) and "(interrupted)" in out
    assert "Traceback" not in err


def test_bad_sources_are_reported_and_the_rest_proceeds(tmp_path: Path) -> None:
    out = tunecache("tune", "--suite", "no-such-suite", "--op", "matmul(M=2,N=3)", "--op", C.text,
                    "--trials", "1", "--no-refine", "--no-baseline", "--json", root=tmp_path)
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert [o["status"] for o in report["ops"]] == ["tuned"]
    problems = " ".join(report["problems"])
    assert "unknown suite 'no-such-suite'" in problems and "missing dim(s) K" in problems
    assert "Traceback" not in out.stderr


def test_usage_errors(tmp_path: Path) -> None:
    for args, fragment in [((), "nothing to tune"), (("--op", C.text, "--budget", "soon"),
                                                     "not a duration"),
                           (("--suite", "nope"), "nothing left to tune")]:
        out = tunecache("tune", *args, root=tmp_path)
        assert out.returncode == 2 and fragment in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr


def test_wanted_list_feeds_the_job(tmp_path: Path) -> None:
    store = Store(tmp_path)
    add_wanted(store.location, HW.hw_id, [(C, 7, "model.onnx"), (A, 1, None)])
    add_wanted(store.location, HW.hw_id, [(C, 3, "other.onnx")])
    workloads, problems = collect_workloads(wanted=True, store=store, hw=HW)
    assert not problems
    counts = {w.op: w.count for w in workloads}
    assert counts == {C: 10, A: 1}
    assert "model.onnx" in next(w.label for w in workloads if w.op == C)


def test_merge_workloads_sums_counts() -> None:
    merged = merge_workloads([Workload(A, 1, "x"), Workload(C, 2, "y"), Workload(A, 2, "z")])
    assert [(w.op, w.count) for w in merged] == [(A, 3), (C, 2)]
    assert merged[0].label == "x; z"


def test_cli_summary_and_publish(tmp_path: Path) -> None:
    quiet = tunecache("tune", "--op", C.text, "--trials", "2", "--no-refine", root=tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    # Recorded, not served: the summary says so and how to publish.
    assert "not published" in quiet.stdout and "tunecache cache publish --root" in quiet.stdout
    assert not (tmp_path / "published").exists() or not os.listdir(tmp_path / "published")
    out = tunecache("tune", "--op", C.text, "--trials", "2", "--no-refine", "--publish",
                    root=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "tuned" in out.stdout and "published" in out.stdout
    assert "not published" not in out.stdout
    assert os.listdir(tmp_path / "published")


def test_train_then_the_next_job_ranks_with_the_model(tmp_path: Path) -> None:
    out = tunecache("tune", "--op", A.text, "--op", C.text, "--trials", "3", "--no-refine",
                    "--explore", "2", "--no-baseline", "--train", "--json", root=tmp_path)
    assert out.returncode == 0, out.stderr
    version = json.loads(out.stdout)["trained_model"]
    assert version
    assert "explore" in set(Store(tmp_path).load()["source"])
    other = matmul_op(16, 32, 16)
    again = tunecache("tune", "--op", other.text, "--trials", "3", "--no-refine",
                      "--no-baseline", root=tmp_path)
    assert again.returncode == 0, again.stderr
    frame = Store(tmp_path).load()
    rows = frame[(frame["op_text"] == other.text) & (frame["source"] != "confirm")]
    # the tiler's first choice (what an untuned compile runs) and its best at the other
    # thread count (a small op) are measured, then the model's
    pool = candidates(other, local_spec(), k=10)
    leaders = {next(c.schedule.schedule_id for c in pool if c.schedule.threads == t)
               for t in {c.schedule.threads for c in pool}}
    assert sorted(rows["source"]) == ["model"] * (3 - len(leaders)) + ["tiler"] * len(leaders)
    assert set(rows[rows["source"] == "model"]["model_version"]) == {version}
    assert set(rows[rows["source"] == "tiler"]["schedule_id"]) == leaders
    assert pool[0].schedule.schedule_id in leaders


def test_model_workloads_are_counted_and_unreadable_models_reported(tmp_path: Path) -> None:
    import onnx
    from onnx_support import mlp_model

    from tunecache.compiler.frontend import kernel_ops

    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), path)
    ops = kernel_ops(path)
    workloads, problems = collect_workloads(models=[path, tmp_path / "missing.onnx"])
    assert {w.op for w in workloads} == {op for op, _, _ in ops}
    assert sum(w.count for w in workloads) == sum(count for _, count, _ in ops)
    assert all(w.label.startswith("mlp.onnx:") for w in workloads)
    assert len(problems) == 1 and "missing.onnx" in problems[0]
    out = tunecache("tune", "--model", str(path), "--trials", "1", "--no-refine",
                    "--no-baseline", "--json", root=tmp_path / "store")
    assert out.returncode == 0, out.stderr
    assert {o["status"] for o in json.loads(out.stdout)["ops"]} == {"tuned"}


BERT_EXPORT = Path(__file__).parent / "data" / "exporters" / "bert_torchscript17.onnx"


def test_a_dynamic_model_is_tuned_at_the_shape_its_flags_give(tmp_path: Path) -> None:
    """A transformer export's batch and sequence are dynamic: ``--input-shape`` fixes
    them (``attention_mask`` follows ``input_ids`` by dimension name), and the job tunes
    exactly the ops a compile at that shape runs. Without it, or with a flag that names no
    input or does not fit, the message names the flag."""
    from tunecache.compiler.frontend import kernel_ops

    hw = local_spec()
    want = {op for op, _, _ in kernel_ops(BERT_EXPORT, {"input_ids": [1, 16],
                                                        "attention_mask": [1, 16]}, hw=hw)}
    workloads, problems = collect_workloads(
        models=[BERT_EXPORT], hw=hw,
        model_shapes={str(BERT_EXPORT): {"input_ids": [1, 16], "attention_mask": [1, 16]}})
    assert not problems and {w.op for w in workloads} == want
    root = tmp_path / "store"
    out = tunecache("tune", "--model", str(BERT_EXPORT), "--input-shape", "input_ids=1,16",
                    "--trials", "1", "--no-refine", "--no-baseline", "--json", root=root)
    assert out.returncode == 0, out.stderr
    assert {OpSignature.parse(o["op"]) for o in json.loads(out.stdout)["ops"]} == want
    for flags, fragment in [((), "give --input-shape input_ids=D1,D2,..."),
                            (("--input-shape", "input_idz=1,16"),
                             "--input-shape names 'input_idz', which is not an input of any"),
                            (("--input-shape", "input_ids=1,2,3"),
                             "--input-shape input_ids=1,2,3: the model declares input_ids")]:
        bad = tunecache("tune", "--model", str(BERT_EXPORT), *flags, "--trials", "1",
                        root=root)
        lines = bad.stderr.strip().splitlines()
        assert bad.returncode == 2 and lines[-1].startswith("error: "), bad.stderr
        assert fragment in lines[-1] and "Traceback" not in bad.stderr


def test_a_model_left_dynamic_is_skipped_and_the_rest_tuned(tmp_path: Path) -> None:
    """Without --input-shape the export is left out with a warning naming the flag, an
    unreadable model with one naming it, and the --op is tuned: exit 1 (partial)."""
    out = tunecache("tune", "--model", str(BERT_EXPORT), "--model", str(tmp_path / "no.onnx"),
                    "--op", "matmul(M=8,N=16,K=8)", "--trials", "1", "--no-refine",
                    "--no-baseline", "--json", root=tmp_path / "store")
    assert out.returncode == 1, out.stderr
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, out.stderr
    assert "give --input-shape input_ids=D1,D2,..." in warnings[0]
    assert "no.onnx" in warnings[1]
    assert [o["status"] for o in json.loads(out.stdout)["ops"]] == ["tuned"]


def test_exploration_samples_the_grid_and_resumes_without_repeats(tmp_path: Path) -> None:
    from tunecache.tuner.search import roller

    store = Store(tmp_path)
    op = matmul_op(40, 72, 24)
    options = JobOptions(trials=2, refine=False, baseline=False, explore=4)
    with Runner(HW, FAST) as runner:
        first = run_job([Workload(op, 1, "x")], HW, store, options, runner=runner)
        again = run_job([Workload(op, 1, "x")], HW, store, options, runner=runner)
    frame = store.load()
    explored = frame[frame["source"] == "explore"]
    sample = {s.schedule_id for s in roller.exhaustive_space(op, HW, limit=4, seed=7)}
    assert first.ops[0].status == "tuned"
    assert 1 <= len(explored) <= 4 and set(explored["schedule_id"]) <= sample
    # what the ranked trials already measured is not measured twice (the finalists'
    # repeats aside)
    assert frame[frame["source"] != "confirm"]["schedule_id"].is_unique
    assert again.ops[0].status == "skipped" or again.ops[0].trials == 0


def test_an_int8_convolution_is_tuned_against_onnxruntimes_float32_conv(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from tunecache.compiler.kinds.conv2d import conv2d_op

    op = conv2d_op(1, 32, 10, 10, 32, 3, 3, pads=1, dtype="int8", epilogue="dequant+bias+relu")
    with Runner(HW, FAST) as runner:  # a one-node Conv takes no int8 weights: the float32 one
        summary = run_job([Workload(op, 1, "q")], HW, Store(tmp_path),
                          JobOptions(trials=2, refine=False, baseline=True), runner=runner)
    [result] = summary.ops
    assert result.status == "tuned", result.note
    assert result.baseline == "onnxruntime" and result.baseline_gflops


def test_a_failing_baseline_is_a_note_not_the_end_of_the_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tunecache.tuner.jobs import run as job_run

    def refuse(*args: Any) -> None:
        raise RuntimeError("the peer refused the model")

    monkeypatch.setattr(job_run, "measure_baseline", refuse)
    with Runner(HW, FAST) as runner:
        summary = run_job([Workload(C, 1, "c")], HW, Store(tmp_path),
                          JobOptions(trials=2, refine=False, baseline=True), runner=runner)
    [result] = summary.ops
    assert result.status == "tuned" and result.best_gflops
    assert result.baseline is None and "baseline failed: RuntimeError" in (result.note or "")
