"""Test-session setup: private build cache and store root, never the user's."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

_SESSION_DIR = Path(tempfile.mkdtemp(prefix="tunecache-tests-"))
# Kernels are shared across the session (building is the slow part); set before any import
# of tunecache reads the environment, and inherited by worker subprocesses and by
# pytest-xdist's workers (started after the controller has read this file), so every worker
# builds into one cache. Each worker keeps its own store root.
os.environ.setdefault("TUNECACHE_BUILD_CACHE", str(_SESSION_DIR / "kernels"))
os.environ["TUNECACHE_HOME"] = str(_SESSION_DIR / "home")
os.environ.pop("TUNECACHE_HARDWARE", None)
# The shipped seed would turn the cache misses most tests rely on into hits on the machines
# it was measured on; the seed's own tests turn it back on.
os.environ["TUNECACHE_SEED"] = "off"


@pytest.fixture(scope="session")
def hw():
    from tunecache.compiler.hardware import local_spec

    return local_spec()


_fault_cases: dict[str, int] = {"passed": 0, "failed": 0}
_fuzzed: Counter[str] = Counter()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Carry each test's fuzzed-example counts on its report: under pytest-xdist the
    counting happens in a worker and the summary is written by the controller."""
    outcome = yield
    if call.when == "call":
        from fault_support import FUZZED

        if FUZZED:
            outcome.get_result().user_properties.append(("fuzzed", dict(FUZZED)))
            FUZZED.clear()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and "fault" in report.keywords:
        _fault_cases["passed" if report.passed else "failed"] += 1
    for name, value in report.user_properties:
        if name == "fuzzed":
            _fuzzed.update(value)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    explicit = _fault_cases["passed"] + _fault_cases["failed"]
    if explicit == 0:
        return
    fuzzed = sum(_fuzzed.values())
    families = ", ".join(f"{name} {count}" for name, count in sorted(_fuzzed.items()))
    terminalreporter.write_line(
        f"fault suite: {explicit + fuzzed} cases ({explicit} fault tests, {_fault_cases['failed']} "
        f"failed; {fuzzed} fuzzed examples: {families or 'none'})")
