"""How generated kernels' threads wait between parallel regions.

libgomp's default is to spin for about 300,000 iterations before sleeping. On a quiet
machine that saves a wake-up per region; on a shared one (a farm node, a deploy host
running other services) a spinning thread holds a core that the thread it waits for
needs, and a 2-thread BERT layer ran 2.8x slower beside one CPU-burning process. A short
spin keeps most of the quiet-machine latency and degrades like the peers do under load
(``benchmarks/busy_machine.py`` measures both). libgomp reads the policy once, when it
loads, so :func:`configure_openmp` must run before the first kernel is loaded; the
measurement workers inherit it from the environment.
"""

from __future__ import annotations

import os

WAIT_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
DEFAULT_SPINCOUNT = 10_000
"""Spin iterations before a waiting thread sleeps (libgomp's default: 300,000)."""


def configure_openmp() -> None:
    """Make kernels' threads wait politely, unless the user chose a policy: an explicit
    ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` in the environment is left as it is."""
    if any(name in os.environ for name in WAIT_ENV):
        return
    os.environ["GOMP_SPINCOUNT"] = str(DEFAULT_SPINCOUNT)
