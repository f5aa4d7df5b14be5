"""The compile-time decision for each kernel op: use the cache, guess, or measure now.

On a cache hit the measured schedule is used. On a miss the policy weighs what measuring a
few candidates now would gain over the whole deployment against what it costs:

* expected latency of the best guess: the analytic estimate of the tiler's top-1 (or of the
  cost model's top-1 when a model exists);
* expected gain per call: that latency times the fraction a guess typically loses to the
  measured best (``GUESS_LOSS``, from ``docs/BENCHMARKS.md``: tiler top-1 vs best of top-10);
* expected gain over the deployment: gain per call × ``expected_calls``;
* tuning cost: ``trials`` × (compile time + measuring time), and it must fit before the
  compile deadline.

Named policies:

* ``cache-only`` — hits only; a miss runs numpy's reference implementation (no schedule that
  was never measured here is compiled);
* ``analytic`` — a miss uses the tiler's top-1;
* ``balanced`` (default) — a miss uses the schedule of the nearest tuned hardware (re-fitted
  here) when the cache offers one, else the cost model's (else the tiler's) top-1, unless
  measuring pays for itself within the deadline;
* ``tune`` — a miss is measured now whenever the deadline allows.

A schedule from the nearest tuned hardware (:class:`Nearest`) is a measured schedule, but
not measured here: ``cache-only`` does not serve it and ``analytic`` keeps to the tiler.

Decisions depend only on the inputs and the clock passed in, so they are deterministic under
a fake clock, and each carries a one-line reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule, default_schedule, problems
from tunecache.costmodel.analytic import estimate
from tunecache.tuner.kinds import tuner_kind
from tunecache.tuner.search import Ranker, roller
from tunecache.tuner.search.refit import Nearest

POLICIES = ("cache-only", "analytic", "balanced", "tune")
# Fraction of runtime an unmeasured guess loses, on average, to the best of a short search
# (a neighbour's schedule: docs/BENCHMARKS.md, "Nearest-hardware serving").
GUESS_LOSS = {"nearest": 0.05, "tiler": 0.12, "model": 0.06, "default": 0.3}
COMPILE_S = 0.4  # one candidate's C compile (measured: 0.3-0.5 s here)
MEASURE_OVERHEAD_S = 0.15  # check against the reference, warm-up, timing floor


class PolicyError(TunecacheError):
    """Unknown policy name or bad policy settings."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Settings of a compile-time policy."""

    name: str = "balanced"
    expected_calls: int = 1000
    deadline_s: float | None = None
    trials: int = 3

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise PolicyError(f"unknown policy {self.name!r}; choose one of {', '.join(POLICIES)}")
        if self.expected_calls < 0:
            raise PolicyError(f"expected calls must be >= 0, got {self.expected_calls}")
        if self.deadline_s is not None and self.deadline_s < 0:
            raise PolicyError(f"deadline must be >= 0 seconds, got {self.deadline_s}")
        if self.trials < 1:
            raise PolicyError(f"trials must be >= 1, got {self.trials}")


@dataclass(frozen=True, slots=True)
class Guess:
    """The best unmeasured schedule for an op and where it came from."""

    schedule: Schedule
    source: str  # "nearest", "model", "tiler" or "default"
    expected_s: float | None
    note: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do for one kernel op, and why.

    ``action``: ``cache`` (measured schedule from the cache), ``guess`` (use ``schedule``
    unmeasured), ``measure`` (measure candidates now, then use the best) or ``numpy`` (run
    the reference implementation).
    """

    action: str
    schedule: Schedule | None
    source: str
    reason: str
    expected_s: float | None
    tuning_cost_s: float = 0.0


def best_guess(op: OpSignature, hw: HardwareSpec, model: Ranker | None = None,
               use_model: bool = True, threads: int | None = None) -> Guess:
    """The tiler's top-1, re-ranked by the cost model when one is given; ranked for
    ``threads`` when given (a run bounded to fewer threads than ``hw`` has cores)."""
    try:
        pool = roller.candidates(op, hw, k=10, threads=threads)
    except ValueError:
        pool = []
    if not pool:
        schedule = default_schedule(op, hw, hw.cores)
        if problems(op, schedule, hw):
            schedule = default_schedule(op, hw, 1)
        return Guess(schedule, "default", None)
    if model is not None and use_model and not tuner_kind(op.kind).unseen(pool[0].schedule):
        scores = list(model.predict(op, [c.schedule for c in pool], hw))
        best = max(range(len(pool)), key=lambda i: (scores[i], -pool[i].rank))
        return Guess(pool[best].schedule, "model", pool[best].estimate.seconds)
    return Guess(pool[0].schedule, "tiler", pool[0].estimate.seconds)


class Policy:
    """Decides per op; keeps the deadline's clock. One instance per compile."""

    def __init__(self, config: PolicyConfig, hw: HardwareSpec, *,
                 model: Ranker | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 threads: int | None = None) -> None:
        self.config = config
        self.hw = hw
        self.model = model
        self.threads = threads
        self.clock = clock
        self.started = clock()

    def remaining_s(self) -> float | None:
        if self.config.deadline_s is None:
            return None
        return max(0.0, self.config.deadline_s - (self.clock() - self.started))

    def _nearest_guess(self, op: OpSignature, nearest: Nearest | None) -> Guess | None:
        if nearest is None:
            return None
        fitted = nearest.fitted(op, self.hw)
        if fitted is None:
            return None
        if nearest.shape_from is not None:
            return Guess(fitted, "nearest", estimate(op, fitted, self.hw).seconds,
                         f" (nearest tuned shape {nearest.shape_from}: "
                         f"{nearest.median_s * 1e3:.3f} ms)")
        return Guess(fitted, "nearest", nearest.median_s,
                     f" (nearest tuned hardware {nearest.hw_id}, distance "
                     f"{nearest.distance:.2f}: {nearest.median_s * 1e3:.3f} ms there)")

    def decide(self, op: OpSignature, hit: Schedule | None, hit_s: float | None = None,
               hit_note: str = "", nearest: Nearest | None = None) -> Decision:
        """The decision for ``op`` given the cache's entry (``hit``, its measured seconds)
        or, on a miss, what the nearest tuned hardware offers."""
        cfg = self.config
        if hit is not None:
            found = problems(op, hit, self.hw)
            if not found:
                return Decision("cache", hit, "cache", f"cache hit{hit_note}", hit_s)
            miss_reason = f"cached schedule unusable here ({found[0]})"
        else:
            miss_reason = "cache miss"
        if cfg.name == "cache-only":
            return Decision("numpy", None, "numpy",
                            f"{miss_reason}; policy cache-only runs the numpy reference", None)
        guess = (self._nearest_guess(op, nearest) if cfg.name in ("balanced", "tune") else None) \
            or best_guess(op, self.hw, self.model, use_model=cfg.name != "analytic",
                          threads=self.threads)
        if cfg.name == "analytic":
            return Decision("guess", guess.schedule, guess.source,
                            f"{miss_reason}; policy analytic uses the tiler's top-1",
                            guess.expected_s)
        expected = guess.expected_s
        per_candidate = COMPILE_S + MEASURE_OVERHEAD_S + 10 * (expected or 0.0)
        cost = cfg.trials * per_candidate
        remaining = self.remaining_s()
        fits = remaining is None or cost <= remaining
        if cfg.name == "tune":
            if fits:
                return Decision("measure", guess.schedule, "measured",
                                f"{miss_reason}; policy tune measures {cfg.trials} candidates "
                                f"(~{cost:.1f} s)", expected, cost)
            return Decision("guess", guess.schedule, guess.source,
                            f"{miss_reason}; measuring (~{cost:.1f} s) does not fit the "
                            f"deadline ({remaining:.1f} s left): {_named(guess)}", expected)
        loss = GUESS_LOSS[guess.source]
        gain = (expected or 0.0) * loss * cfg.expected_calls
        if gain > cost and fits:
            return Decision("measure", guess.schedule, "measured",
                            f"{miss_reason}; expected gain {gain:.2f} s over "
                            f"{cfg.expected_calls} calls > tuning cost {cost:.1f} s: measure "
                            f"{cfg.trials}", expected, cost)
        why = (f"expected gain {gain:.3f} s over {cfg.expected_calls} calls <= tuning cost "
               f"{cost:.1f} s" if gain <= cost else
               f"tuning (~{cost:.1f} s) does not fit the deadline ({remaining:.1f} s left)")
        return Decision("guess", guess.schedule, guess.source,
                        f"{miss_reason}; {why}: {_named(guess)}", expected)


def _named(guess: Guess) -> str:
    if guess.source == "nearest":
        return f"nearest hardware's schedule{guess.note}"
    return f"{guess.source} top-1"
