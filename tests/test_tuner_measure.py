"""The runner: real kernels in a real worker process, with injected faults."""

from __future__ import annotations

import dataclasses
import os
import statistics
from typing import Any

import pytest

from tunecache.compiler.codegen import KernelSource, generate
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import compile_kernel
from tunecache.compiler.schedule import default_schedule
from tunecache.tuner.measure import (
    Candidate,
    MeasureResult,
    Runner,
    TimingConfig,
    best,
    noisy,
    worker,
)

HW = local_spec()
OP = matmul_op(48, 40, 32, epilogue="relu")
FAST = TimingConfig(min_time_s=0.02, min_repeats=3, timeout_s=20.0)


def good() -> KernelSource:
    return generate(OP, default_schedule(OP, HW), HW)


def inject(kernel: KernelSource, old: str, new: str) -> KernelSource:
    assert old in kernel.code
    return dataclasses.replace(kernel, code=kernel.code.replace(old, new, 1))


ENTRY = "int tc_kernel(void **args) {"


# A matmul's weights are packed once and it is timed through the pre-packed entry, so a
# fault goes into both entries: whichever the worker runs must fail.
ENTRIES = (ENTRY, "int tc_kernel_packed(void **args) {")


def at_entries(statement: str) -> KernelSource:
    kernel = good()
    for entry in ENTRIES:
        kernel = inject(kernel, entry, entry + " " + statement)
    return kernel


def segfaults() -> KernelSource:
    return at_entries("*(volatile int *)0 = 1;")


def hangs() -> KernelSource:
    return at_entries("volatile int spin = 1; while (spin) {}")


def wrong() -> KernelSource:
    kernel = good()
    code = kernel.code
    for entry in ENTRIES:
        tail = code.index("  return 0;\n}", code.index(entry))
        code = code[:tail] + "  C[7] += 0.5f;\n" + code[tail:]
    return dataclasses.replace(kernel, code=code)


def broken() -> KernelSource:
    return inject(good(), ENTRY, "#error injected compile failure\n" + ENTRY)


def test_good_kernel_is_timed_with_raw_runtimes() -> None:
    with Runner(HW, FAST) as runner:
        [result] = runner.measure([Candidate(OP, default_schedule(OP, HW), source="manual")])
    assert result.status == "ok", result.error
    assert len(result.runtimes_s) >= FAST.min_repeats
    assert result.min_s <= result.median_s
    assert result.gflops == pytest.approx(OP.flops / result.median_s / 1e9)
    assert result.compiler and result.source_hash and "-O3" in result.flags


def test_faults_are_classified_and_the_caller_survives() -> None:
    timing = dataclasses.replace(FAST, timeout_s=4.0)
    kernels = [segfaults(), good(), hangs(), wrong(), broken(), good()]
    with Runner(HW, timing) as runner:
        results = runner.measure_kernels(kernels)
    statuses = [r.status for r in results]
    assert statuses == ["runtime_error", "ok", "timeout", "wrong_result", "compile_error", "ok"]
    assert "SIGSEGV" in results[0].error
    assert "4 s" in results[2].error
    assert "wrong" in results[3].error and "(0, 7)" in results[3].error
    assert "injected compile failure" in results[4].error
    assert best(results) in (results[1], results[5])


def test_invalid_schedule_is_a_status_not_an_exception() -> None:
    bad = default_schedule(OP, HW).replace(mr=99)
    with Runner(HW, FAST) as runner:
        results = runner.measure([Candidate(OP, bad, source="tiler", predicted=1.0),
                                  Candidate(OP, default_schedule(OP, HW))])
    assert [r.status for r in results] == ["invalid", "ok"]
    assert "mr=99" in results[0].error
    assert results[0].source == "tiler" and results[0].predicted == 1.0
    assert best(results) is results[1]


def test_numpy_baseline_and_progress_callback() -> None:
    seen = []
    with Runner(HW, FAST) as runner:
        runner.measure([Candidate(OP, default_schedule(OP, HW))], progress=seen.append)
        baseline = runner.measure_numpy(OP, threads=1)
    assert len(seen) == 1 and seen[0].ok
    assert baseline.status == "ok" and baseline.gflops and baseline.gflops > 0


def test_worker_is_restarted_after_a_crash() -> None:
    with Runner(HW, FAST) as runner:
        runner.measure_kernels([good()])
        first_pid = runner.worker_pid
        runner.measure_kernels([segfaults()])
        [after] = runner.measure_kernels([good()])
        assert after.ok and runner.worker_pid not in (None, first_pid)
    assert os.getpid()  # still here



def test_noisy_timings_are_retimed_and_the_quietest_attempt_kept() -> None:
    assert not noisy([1.0, 1.02, 1.05], 0.10)
    assert noisy([1.0, 1.3, 1.4], 0.10)
    assert not noisy([1.0], 0.10)

    class Burst:
        """A worker whose first timing ran beside a neighbour's burst, then quiet ones."""

        def __init__(self) -> None:
            self.requests: list[dict[str, object]] = []

        def alive(self) -> bool:
            return True

        def request(self, req: dict[str, object], timeout_s: float) -> dict[str, object]:
            self.requests.append(req)
            return {"status": "ok", "runtimes_s": [1.0, 1.01, 1.02]}

    runner = Runner(HW, FAST)
    worker = Burst()
    runner._workers["kernel"] = worker  # type: ignore[assignment]
    first = MeasureResult(OP, default_schedule(OP, HW), "ok", runtimes_s=(1.0, 1.5, 1.6))
    kept = runner._retime_if_noisy(first, {"kind": "kernel", "id": 1, "check": True})
    assert kept.runtimes_s == (1.0, 1.01, 1.02)
    assert [r["check"] for r in worker.requests] == [False]  # quiet now: no third attempt

    quiet = MeasureResult(OP, default_schedule(OP, HW), "ok", runtimes_s=(1.0, 1.01, 1.02))
    assert runner._retime_if_noisy(quiet, {"kind": "kernel", "id": 2}) is quiet
    failed = MeasureResult(OP, default_schedule(OP, HW), "wrong_result", runtimes_s=(1.0, 2.0))
    assert runner._retime_if_noisy(failed, {"kind": "kernel", "id": 3}) is failed
    assert len(worker.requests) == 1


def test_prepacked_timing_is_checked_and_times_the_bound_kernel() -> None:
    op = conv2d_op(1, 16, 8, 8, 32, 3, 3, pads=1, epilogue="bias")
    schedule = default_schedule(op, HW)
    with Runner(HW, dataclasses.replace(FAST, prepacked_weights=False)) as per_call, \
            Runner(HW, dataclasses.replace(FAST, prepacked_weights=True)) as packed:
        [a] = per_call.measure([Candidate(op, schedule)])
        [b] = packed.measure([Candidate(op, schedule)])
    # Both paths are checked against the reference before they are timed.
    assert a.status == b.status == "ok", (a.error, b.error)
    # The worker says which entry it timed: the weight-bound one only when asked for.
    # (That packing once makes it faster is a timing claim: benchmarks/conv2d_vs_onnxruntime.)
    path = compile_kernel(op, schedule, HW).path
    timing = {"repeat_s": 0.001, "min_repeats": 1, "min_time_s": 0.0, "max_repeats": 1}
    answers = [worker._measure_kernel({"op": op.text, "path": str(path), "backend": "cpu", "prepacked": flag,
                                       "timing": timing}, worker._Inputs())
               for flag in (True, False)]
    assert [r["status"] for r in answers] == ["ok", "ok"]
    assert [r["prepacked"] for r in answers] == [True, False]


def test_constant_weights_are_timed_cold_unless_asked_not_to() -> None:
    """A model's weights (a matmul's B, packed once or read in place) are timed rotated
    through copies spanning twice the L3, so no call finds them left in cache by the last
    one; ``cold_weights=False`` and activation products (batch_matmul) keep one copy."""
    timing = {"repeat_s": 0.001, "min_repeats": 1, "min_time_s": 0.0, "max_repeats": 1}
    op = matmul_op(4, 256, 512, epilogue="bias")
    span = 2 * HW.l3_bytes
    for pack_b in (1, 0):
        schedule = dataclasses.replace(default_schedule(op, HW), pack_b=pack_b)
        path = str(compile_kernel(op, schedule, HW).path)
        for cold_bytes, copies in ((span, min(64, -(-span // (256 * 512 * 4)))), (0, 0)):
            answer = worker._measure_kernel({"op": op.text, "path": path, "backend": "cpu", "prepacked": True,
                                             "cold_bytes": cold_bytes, "timing": timing},
                                            worker._Inputs())
            assert answer["status"] == "ok" and answer["weight_copies"] == copies
    products = batch_matmul_op(1, 4, 256, 512)
    path = str(compile_kernel(products, default_schedule(products, HW), HW).path)
    answer = worker._measure_kernel({"op": products.text, "path": path, "backend": "cpu", "prepacked": False,
                                     "cold_bytes": span, "timing": timing}, worker._Inputs())
    assert answer["status"] == "ok" and answer["weight_copies"] == 0
    # the runner asks for twice the L3 for constant weights (kernels and the numpy baseline
    # alike), and for nothing when told not to or for activation products
    assert Runner(HW, FAST)._cold_bytes(op) == span
    assert Runner(HW, FAST)._cold_bytes(products) == 0
    assert Runner(HW, dataclasses.replace(FAST, cold_weights=False))._cold_bytes(op) == 0
    baseline = worker._measure_numpy({"op": op.text, "threads": 1, "cold_bytes": span,
                                      "timing": timing}, worker._Inputs())
    assert baseline["status"] == "ok" and baseline["runtimes_s"]
    seen: list[int] = []
    inputs = worker._Inputs().get(op, 0, with_reference=False)[0]
    real = op_kind("matmul").reference
    try:  # the reference, spied on: which weights each call gets
        object.__setattr__(op_kind("matmul"), "reference",
                           lambda o, inputs: seen.append(id(inputs[1])) or real(o, inputs))
        worker._numpy_runner(op, inputs, 3 * 256 * 512 * 4)(7)
    finally:
        object.__setattr__(op_kind("matmul"), "reference", real)
    assert len(set(seen)) == 3 and seen[0] == seen[3]  # three copies, in rotation
    # a one-input op (no weights) times its baseline as ever
    softmax = OpSignature.parse("softmax(M=64,N=128)")
    assert Runner(HW, FAST)._cold_bytes(softmax) == 0
    one = worker._measure_numpy({"op": softmax.text, "threads": 1, "timing": timing},
                                worker._Inputs())
    assert one["status"] == "ok" and one["runtimes_s"]


def test_weights_are_timed_packed_by_default_and_activation_products_are_not() -> None:
    runner = Runner(HW, FAST)
    conv = conv2d_op(1, 8, 6, 6, 16, 3, 3, pads=1)
    products = batch_matmul_op(1, 48, 40, 32)
    assert runner.prepacked(conv) and runner.prepacked(OP) and not runner.prepacked(products)
    forced = Runner(HW, dataclasses.replace(FAST, prepacked_weights=True))
    assert forced.prepacked(products)
    never = Runner(HW, dataclasses.replace(FAST, prepacked_weights=False))
    assert not never.prepacked(conv) and not never.prepacked(OP)


def test_a_failed_retiming_keeps_the_measurement_that_passed() -> None:
    class Crashes:
        def __init__(self) -> None:
            self.requests = 0

        def alive(self) -> bool:
            return True

        def request(self, req: dict[str, object], timeout_s: float) -> dict[str, object]:
            self.requests += 1
            return {"status": "runtime_error", "error": "neighbour took the core"}

    runner = Runner(HW, FAST)
    worker = Crashes()
    runner._workers["kernel"] = worker  # type: ignore[assignment]
    first = MeasureResult(OP, default_schedule(OP, HW), "ok", runtimes_s=(1.0, 1.5, 1.6))
    assert runner._retime_if_noisy(first, {"kind": "kernel", "id": 1}) is first
    assert worker.requests == 1  # no further attempts after a failure


def test_a_race_lands_a_slow_phase_on_every_kernels_same_rounds() -> None:
    """Two timers of equal speed on a machine that halves its speed halfway through: timed
    one after another, the second reads twice as slow; racing, their medians agree."""
    calls = {"n": 0}

    def machine(cost_s: float) -> Any:
        def run(n: int) -> float:
            calls["n"] += 1
            return n * cost_s * (2.0 if calls["n"] > 7 else 1.0)
        return run

    timing = {"repeat_s": 0.01, "min_repeats": 5, "max_repeats": 5, "min_time_s": 0.0}
    first = worker.time_calls(machine(1e-3), timing)
    second = worker.time_calls(machine(1e-3), timing)
    assert statistics.median(second) == pytest.approx(2 * statistics.median(first))
    calls["n"] = 0
    raced = worker.race_calls([machine(1e-3), machine(1e-3)], timing)
    assert [len(s) for s in raced] == [5, 5]
    assert statistics.median(raced[0]) == pytest.approx(statistics.median(raced[1]))


def test_a_race_times_real_kernels_in_input_order_and_reports_what_cannot_run() -> None:
    """Finalists raced in one worker: each ``ok`` with its own repeats and its origin kept;
    a schedule that cannot be generated is ``invalid`` and the others still race."""
    plain = default_schedule(OP, HW)
    other = plain.replace(kc=16) if plain.kc != 16 else plain.replace(kc=8)
    bad = plain.replace(mr=99)
    with Runner(HW, FAST) as runner:
        seen: list[MeasureResult] = []
        results = runner.race([Candidate(OP, plain, "confirm"), Candidate(OP, bad, "confirm"),
                               Candidate(OP, other, "confirm", predicted=2.0)],
                              progress=seen.append)
    assert [r.status for r in results] == ["ok", "invalid", "ok"]
    assert [r.schedule for r in results] == [plain, bad, other]
    assert seen == results
    for r in (results[0], results[2]):
        assert len(r.runtimes_s) >= FAST.min_repeats and r.source == "confirm"
        assert r.compiler and r.source_hash
    assert results[2].predicted == 2.0


def test_a_kernel_that_crashes_in_a_race_fails_it_as_a_value() -> None:
    """A race whose kernel crashes is a ``runtime_error`` for every racer, one that does
    not compile a ``compile_error`` of its own; the runner goes on with a fresh worker."""
    timing = dataclasses.replace(FAST, timeout_s=10.0)
    with Runner(HW, timing) as runner:
        raced = runner.race_kernels([good(), broken(), segfaults()])
        assert [r.status for r in raced] == ["runtime_error", "compile_error", "runtime_error"]
        assert "SIGSEGV" in (raced[0].error or "")
        [again] = runner.measure([Candidate(OP, default_schedule(OP, HW))])
        assert again.ok


def test_a_race_that_hangs_times_out_as_a_value() -> None:
    """A race whose kernel hangs is a ``timeout`` for every racer once the racers' timeouts
    have passed; the worker is killed and the next measurement gets a fresh one."""
    timing = dataclasses.replace(FAST, timeout_s=2.0)
    with Runner(HW, timing) as runner:
        raced = runner.race_kernels([good(), hangs()])
        assert [r.status for r in raced] == ["timeout", "timeout"]
        assert "4 s" in (raced[0].error or "")
        [again] = runner.measure([Candidate(OP, default_schedule(OP, HW))])
        assert again.ok
