"""The fault suite's case count: every bad input or injected fault a test feeds tunecache.

Tests marked ``fault`` count as one case each (a parametrised case is a case); fuzzing
tests add one per example they run through :func:`fuzzed`. ``conftest.py`` prints the total.
"""

from __future__ import annotations

from collections import Counter

FUZZED: Counter[str] = Counter()


def fuzzed(family: str) -> None:
    """Count one fuzzed example of ``family`` (op text, schedule, spec, graph, ...)."""
    FUZZED[family] += 1
