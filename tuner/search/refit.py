"""Fitting a schedule tuned on other hardware to this one.

A schedule served from the nearest tuned hardware (:mod:`tunecache.cache.nearest`) keeps
its tiles and loop structure, which depend mostly on the ISA level and cache sizes that the
neighbour shares; what changes with the machine is how many cores it splits across. A
schedule that used every core of its machine uses every core here; one that used fewer
keeps its count, capped at this machine's cores. The result must be legal here, or there is
nothing to serve.
"""

from __future__ import annotations

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule, problems


def refit(op: OpSignature, schedule: Schedule, hw: HardwareSpec,
          tuned_cores: int | None = None) -> Schedule | None:
    """``schedule``, tuned on a machine with ``tuned_cores`` cores, fitted to ``hw``; None
    when neither it nor its re-threaded form is legal here."""
    threads = schedule.threads
    if tuned_cores is not None and threads == tuned_cores:
        threads = hw.cores
    threads = max(1, min(threads, hw.cores))
    fitted = schedule.replace(threads=threads) if threads != schedule.threads else schedule
    for candidate in (fitted, schedule):
        if candidate.threads <= hw.cores and not problems(op, candidate, hw):
            return candidate
    return None
