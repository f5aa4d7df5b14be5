"""Test-session setup: private build cache and store root, never the user's."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_SESSION_DIR = Path(tempfile.mkdtemp(prefix="tunecache-tests-"))
# Kernels are shared across the session (building is the slow part); set before any import
# of tunecache reads the environment, and inherited by worker subprocesses.
os.environ.setdefault("TUNECACHE_BUILD_CACHE", str(_SESSION_DIR / "kernels"))
os.environ["TUNECACHE_HOME"] = str(_SESSION_DIR / "home")
os.environ.pop("TUNECACHE_HARDWARE", None)


@pytest.fixture(scope="session")
def hw():
    from tunecache.compiler.hardware import local_spec

    return local_spec()
