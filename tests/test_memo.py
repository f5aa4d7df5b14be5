"""IdentityMemo: a value made once per (sources, key) and reused, made again for other
sources or another key, and forgotten when a source is collected."""

from __future__ import annotations

import gc

import numpy as np

from tunecache.compiler.memo import IdentityMemo


def test_values_are_made_once_per_sources_and_key_and_forgotten_with_them() -> None:
    memo: IdentityMemo[np.ndarray] = IdentityMemo()
    made: list[int] = []

    def make(value: int) -> np.ndarray:
        made.append(value)
        return np.full(3, value)

    a, b = np.zeros(4), np.zeros(4)  # equal contents, distinct arrays
    first = memo.get((a,), "x", lambda: make(1))
    assert memo.get((a,), "x", lambda: make(2)) is first
    assert memo.get((b,), "x", lambda: make(3)) is not first  # identity, not contents
    assert memo.get((a,), "y", lambda: make(4)) is not first
    assert made == [1, 3, 4] and len(memo) == 3
    del a
    gc.collect()
    assert len(memo) == 1  # both entries made from a are gone
