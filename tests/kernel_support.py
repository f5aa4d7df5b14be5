"""Shared checks of generated kernels for the codegen tests."""

from __future__ import annotations

import numpy as np

from tunecache.compiler.runtime import Kernel


def bound_weights_problem(kernel: Kernel, inputs: tuple[np.ndarray, ...],
                          expected: np.ndarray) -> str | None:
    """Weights packed once, then two calls: must be bit-identical to packing every call."""
    bound = kernel.bind_weights(inputs[1])
    for _ in range(2):
        packed = np.full_like(expected, np.nan)
        bound(inputs[0], *inputs[2:], out=packed)
        if not np.array_equal(packed, expected):
            return "pre-packed weights give a different result"
    return None
