"""Fitting a schedule tuned on other hardware to this one, with the tiler's estimate.

A schedule served from the nearest tuned hardware (:mod:`tunecache.cache.nearest`) keeps
its tiles and loop structure, which depend mostly on the ISA level and cache sizes that the
neighbour shares; what changes with the machine is how many cores it splits across. A
schedule that used every core of its machine uses every core here; one that used fewer
keeps its count, capped at this machine's cores. When the thread count changes, the way the
work is split may no longer fit it (measured: a one-core neighbour's matmul blocked as one
128-row panel ran on one of two threads, and a BERT layer served that way ran 1.76x slower
than its exact-hit schedules), so the schedule then takes the one refinement move that the
analytic estimate finds clearly faster (by :data:`REFIT_MARGIN`), if any: one step mends
the split; more would trade measured choices for estimated ones. The result must be legal
here, or there is nothing to serve.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunecache.cache.nearest import CacheView, Served
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule, problems
from tunecache.costmodel import analytic
from tunecache.tuner.search.tune import neighbours

REFIT_MARGIN = 1.10
"""How much faster (estimated) a move must be to replace the measured choice: the estimate
ranks less well than a measurement, so only clear gains override it."""
REFIT_STEPS = 1


def refit(op: OpSignature, schedule: Schedule, hw: HardwareSpec,
          tuned_cores: int | None = None, *, resized: bool = False) -> Schedule | None:
    """``schedule``, tuned on a machine with ``tuned_cores`` cores, fitted to ``hw``; None
    when neither it nor its re-threaded form is legal here. ``resized``: it was tuned for
    other sizes of the op (the nearest tuned shape), so its split is re-checked too."""
    threads = schedule.threads
    if tuned_cores is not None and threads == tuned_cores:
        threads = hw.cores
    threads = max(1, min(threads, hw.cores))
    fitted = schedule.replace(threads=threads) if threads != schedule.threads else schedule
    for candidate in (fitted, schedule):
        if candidate.threads <= hw.cores and not problems(op, candidate, hw):
            changed = resized or candidate.threads != schedule.threads
            return _resplit(op, candidate, hw) if changed else candidate
    return None


def _resplit(op: OpSignature, schedule: Schedule, hw: HardwareSpec) -> Schedule:
    """Move to a clearly faster (estimated) neighbour if one exists, keeping threads."""
    current = schedule
    current_s = analytic.estimate(op, current, hw).seconds
    for _ in range(REFIT_STEPS):
        moves = [m for m in neighbours(op, current, hw) if m.threads == current.threads]
        if not moves:
            break
        scored = [(analytic.estimate(op, m, hw).seconds, m) for m in moves]
        best_s, best = min(scored, key=lambda pair: (pair[0], pair[1].schedule_id))
        if current_s <= REFIT_MARGIN * best_s:
            break
        current, current_s = best, best_s
    return current


@dataclass(frozen=True, slots=True)
class Nearest:
    """What the cache offers on a miss: the published schedule of the nearest tuned
    hardware (``hw_id``, ``cores``) at ``distance``, measured there at ``median_s``, or of
    the nearest tuned shape (``shape_from``) on this hardware."""

    schedule: Schedule
    median_s: float
    hw_id: str
    distance: float
    cores: int | None = None
    shape_from: str | None = None
    """The op text the schedule was tuned for, when it is the nearest tuned shape's."""

    @classmethod
    def from_served(cls, served: Served, view: CacheView) -> Nearest:
        """The offer of a non-exact entry that ``view`` served."""
        spec = view.spec_of(served.hw_id)
        return cls(served.entry.schedule, served.entry.median_s, served.hw_id,
                   served.distance, spec.cores if spec else None, served.shape_from)

    def fitted(self, op: OpSignature, hw: HardwareSpec) -> Schedule | None:
        """The offered schedule re-fitted to ``op`` on ``hw`` (:func:`refit`)."""
        return refit(op, self.schedule, hw, self.cores, resized=self.shape_from is not None)
