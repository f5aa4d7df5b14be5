"""Host buffers that start on a cache-line boundary.

Every buffer a kernel reads or writes is allocated here: the native arena, packed weights,
and the inputs and outputs a measurement times. numpy's allocator guarantees only 16 bytes,
and a vector kernel whose rows start mid-line splits every full-width load across two lines:
an 8x16 AVX-512 matmul tile reading B in place ran 4-5% slower from a 16-byte offset than
from a 64-byte one, enough to reorder the tuner's candidates.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

ALIGN = 64
"""Bytes: a cache line, and the width of an AVX-512 vector."""


def address_of(array: np.ndarray) -> int:
    """The address of ``array``'s first element, from its array interface."""
    address: int = array.__array_interface__["data"][0]
    return address


def aligned_empty(shape: int | tuple[int, ...], dtype: npt.DTypeLike = np.float32, *,
                  zero: bool = False) -> np.ndarray:
    """An array of ``shape`` whose data starts on an :data:`ALIGN`-byte boundary,
    uninitialised unless ``zero``."""
    dt = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    size = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
    raw = (np.zeros if zero else np.empty)(size + ALIGN, dtype=np.uint8)
    start = -address_of(raw) % ALIGN
    return raw[start:start + size].view(dt).reshape(dims)


def aligned_copy(x: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``x`` starting on an :data:`ALIGN`-byte boundary."""
    out = aligned_empty(x.shape, x.dtype)
    out[...] = x
    return out


def as_aligned(x: np.ndarray) -> np.ndarray:
    """``x`` itself when it is C-contiguous and starts on an :data:`ALIGN`-byte boundary,
    else :func:`aligned_copy` of it."""
    if x.flags.c_contiguous and address_of(x) % ALIGN == 0:
        return x
    return aligned_copy(x)
