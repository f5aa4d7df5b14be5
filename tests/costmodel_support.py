"""Shared pieces of the cost-model tests: the committed fixture of real measurements."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "measurements.parquet"


def fixture_frame() -> pd.DataFrame:
    """The committed measurements (store rows); fails the test loudly when missing."""
    if not FIXTURE.exists():
        pytest.fail(
            f"{FIXTURE} is missing: produce it with `python benchmarks/costmodel_data.py "
            f"--root STORE --fixture {FIXTURE.relative_to(FIXTURE.parents[2])}` "
            "(see docs/COSTMODEL.md) and commit it",
            pytrace=False,
        )
    return pd.read_parquet(FIXTURE)
