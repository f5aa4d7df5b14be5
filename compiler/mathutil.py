"""Integer helpers every layer may import (compiler, cost model, tuner): nothing here imports
the rest of tunecache."""

from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    """``a / b`` rounded up (``b > 0``)."""
    return -(-a // b)


def round_up(x: int, m: int) -> int:
    """``x`` rounded up to a multiple of ``m`` (``m > 0``)."""
    return -(-x // m) * m
