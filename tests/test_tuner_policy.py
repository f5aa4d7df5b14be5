"""Compile-time policy decisions: deterministic under a fake clock, and explained."""

from __future__ import annotations

import pytest

from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import default_schedule
from tunecache.tuner.deploy import Policy, PolicyConfig, PolicyError

HW = local_spec()
BIG = matmul_op(512, 512, 512)
SMALL = matmul_op(8, 16, 8)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeModel:
    version = "fake-1"

    def __init__(self) -> None:
        self.calls = 0

    def predict(self, op, schedules, hw):  # type: ignore[no-untyped-def]
        self.calls += 1
        # Prefer the schedule the tiler ranks last: visible in the decision.
        return [float(i) for i in range(len(schedules))]


def decide(name: str, op: OpSignature, clock: FakeClock | None = None, **kw):  # type: ignore[no-untyped-def]
    return Policy(PolicyConfig(name=name, **kw), HW, clock=clock or FakeClock()).decide(op, None)


def test_hit_is_used_and_explained() -> None:
    hit = default_schedule(BIG, HW)
    d = Policy(PolicyConfig(), HW, clock=FakeClock()).decide(BIG, hit, 0.004, ": measured 4 ms")
    assert (d.action, d.source, d.schedule, d.expected_s) == ("cache", "cache", hit, 0.004)
    assert "cache hit" in d.reason


def test_unusable_hit_is_a_miss() -> None:
    bad = default_schedule(BIG, HW).replace(threads=HW.cores + 1)
    d = Policy(PolicyConfig(name="analytic"), HW, clock=FakeClock()).decide(BIG, bad)
    assert d.action == "guess" and "unusable here" in d.reason


def test_named_policies_on_a_miss() -> None:
    assert decide("cache-only", BIG).action == "numpy"
    analytic = decide("analytic", BIG)
    assert analytic.action == "guess" and analytic.source == "tiler"
    assert decide("tune", SMALL).action == "measure"
    # balanced: a big op called a million times pays for tuning; a tiny one called once not.
    assert decide("balanced", BIG, expected_calls=1_000_000).action == "measure"
    cheap = decide("balanced", SMALL, expected_calls=1)
    assert cheap.action == "guess" and "<= tuning cost" in cheap.reason


def test_deadline_with_a_fake_clock() -> None:
    clock = FakeClock()
    policy = Policy(PolicyConfig(name="tune", deadline_s=5.0), HW, clock=clock)
    first = policy.decide(BIG, None)
    assert first.action == "measure" and first.tuning_cost_s <= 5.0
    clock.now += 4.9
    late = policy.decide(BIG, None)
    assert late.action == "guess" and "does not fit the deadline" in late.reason
    # Same inputs, same clock: same decision.
    assert policy.decide(BIG, None) == late


def test_decisions_are_deterministic() -> None:
    a = [decide(p, op, expected_calls=10_000) for p in ("analytic", "balanced") for op in (BIG, SMALL)]
    b = [decide(p, op, expected_calls=10_000) for p in ("analytic", "balanced") for op in (BIG, SMALL)]
    assert a == b


def test_model_ranks_the_guess_unless_analytic() -> None:
    model = FakeModel()
    balanced = Policy(PolicyConfig(expected_calls=0), HW, model=model, clock=FakeClock())
    d = balanced.decide(BIG, None)
    assert d.source == "model" and model.calls == 1
    analytic = Policy(PolicyConfig(name="analytic"), HW, model=model, clock=FakeClock())
    assert analytic.decide(BIG, None).source == "tiler" and model.calls == 1
    assert d.schedule != analytic.decide(BIG, None).schedule


@pytest.mark.parametrize(("kw", "fragment"), [({"name": "greedy"}, "unknown policy"),
                                              ({"expected_calls": -1}, "expected calls"),
                                              ({"deadline_s": -1.0}, "deadline"),
                                              ({"trials": 0}, "trials")])
def test_bad_settings(kw, fragment) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PolicyError, match=fragment):
        PolicyConfig(**kw)


def test_a_run_bounded_to_fewer_threads_ranks_its_guess_for_them() -> None:
    """``--threads 1`` on a two-core machine: the guess is the tiler's top-1 for one thread,
    not the two-thread top-1 re-fitted (which kept a kernel-width loop the two-thread
    ranking left rolled: ResNet-50's 128-channel 3x3 stride-2 layer ran 2x slower so)."""
    import dataclasses

    from tunecache.tuner.search import candidates

    hw = dataclasses.replace(HW, cores=2)
    block = f"nchw{hw.lanes}c"  # the blocked layout this machine's vectors take
    op = OpSignature.parse("conv2d(N=1,C=128,H=56,W=56,F=128,R=3,S=3,stride_h=2,stride_w=2,"
                           f"pad_t=1,pad_l=1,pad_b=1,pad_r=1,layout={block},out_layout={block},"
                           "epilogue=bias+relu)")
    bounded = Policy(PolicyConfig(name="analytic"), hw, clock=FakeClock(), threads=1)
    decision = bounded.decide(op, None)
    assert decision.schedule == candidates(op, hw, k=10, threads=1)[0].schedule
    assert decision.schedule is not None and decision.schedule.threads == 1


def test_a_guess_for_an_op_no_schedule_of_the_machine_runs_is_the_default_not_a_crash() -> None:
    """An 8-channel blocked conv on AVX-512 (16 lanes): the tiler proposes nothing, and the
    guess falls back to the kind's default schedule, whose problems name the layout the
    machine takes (the compile then refuses it in one line) instead of an index error."""
    import dataclasses

    from tunecache.compiler.schedule import problems
    from tunecache.tuner.deploy.policy import best_guess
    from tunecache.tuner.search import candidates

    hw = dataclasses.replace(HW.with_isa("avx512"), cores=2)
    op = OpSignature.parse("conv2d(N=1,C=16,H=8,W=8,F=16,R=3,S=3,pad_t=1,pad_l=1,pad_b=1,"
                           "pad_r=1,layout=nchw8c,out_layout=nchw8c)")
    assert candidates(op, hw, k=10) == []
    guess = best_guess(op, hw, threads=1)
    assert guess.source == "default" and guess.expected_s is None
    assert any("nchw16c" in p for p in problems(op, guess.schedule, hw))
