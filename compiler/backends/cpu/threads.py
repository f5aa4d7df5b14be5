"""How generated kernels' threads wait between parallel regions.

A waiting thread spins ``GOMP_SPINCOUNT`` pause instructions before it sleeps (libgomp's
default: 300,000). Too short a spin costs most where requests arrive apart, the way a
deploy server sees them: after 100 ms idle the halted vCPUs of a cloud VM wake in hundreds
of microseconds to milliseconds, longer than a short spin, so the two threads of a run
keep putting each other to sleep (20-46 sleeps per MobileNet-v2 run instead of one) and
the run takes 3-4x its back-to-back time. A spin that outlasts that wake-up (1,000,000
pauses, about 25 ms on Zen 4) keeps the threads awake for the whole run and costs at most
that long a spin after it. The price is paid on an oversubscribed machine: beside one
CPU-burning process per core, a thread that finished its half of a long kernel spins while
its partner waits for a core, and a BERT layer's run grew 2-6x where the short spin's grew
2.4x (MobileNet-v2's small kernels grew alike). Deploy hosts idle between requests are the
common case; a host that is always oversubscribed sets ``GOMP_SPINCOUNT=10000`` (or
``OMP_WAIT_POLICY=passive``), which this leaves alone. ``benchmarks/busy_machine.py``
measures quiet, idle-gap, busy and duty-cycle conditions (figures in docs/BENCHMARKS.md).
libgomp reads the policy once, when it loads, so :func:`configure_openmp` must run before
the first kernel is loaded; the measurement workers inherit it from the environment.
"""

from __future__ import annotations

import os

WAIT_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
DEFAULT_SPINCOUNT = 1_000_000
"""Spin iterations before a waiting thread sleeps (libgomp's default: 300,000)."""


def configure_openmp() -> None:
    """Make kernels' threads spin through a run, unless the user chose a policy: an explicit
    ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` in the environment is left as it is."""
    if any(name in os.environ for name in WAIT_ENV):
        return
    os.environ["GOMP_SPINCOUNT"] = str(DEFAULT_SPINCOUNT)
