"""Kernel element types as numpy holds them: the storage dtype of each (numpy has no
bfloat16, so its bit patterns live in uint16), bfloat16 rounding and decoding, and an op's
arguments decoded to the numbers they hold. The runtime, the executor and the native
program share these, so a tensor crossing between them keeps its element type."""

from __future__ import annotations

import numpy as np

from tunecache.compiler.ops import ELEMENT_STORAGE, OpSignature

__all__ = ["BFLOAT16_NAN", "argument_dtypes", "decoded", "from_bfloat16", "output_dtype", "storage_dtype",
           "to_bfloat16"]


BFLOAT16_NAN = 0x7FC0
"""A quiet NaN's bfloat16 bits: what an output buffer is poisoned with, so an element a
kernel leaves unwritten shows."""


def storage_dtype(element: str) -> np.dtype:
    """The numpy dtype holding arrays of kernel element type ``element``."""
    return np.dtype(ELEMENT_STORAGE[element])


def argument_dtypes(op: OpSignature) -> tuple[np.dtype, ...]:
    """The storage dtypes of ``op``'s input arguments, in ``op.arguments()`` order."""
    return tuple(storage_dtype(a.dtype) for a in op.arguments() if a.role == "input")


def output_dtype(op: OpSignature) -> np.dtype:
    """The storage dtype of ``op``'s output."""
    return storage_dtype(next(a.dtype for a in op.arguments() if a.role == "output"))


def to_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as uint16 bits."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as the float32 values they are."""
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def decoded(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """``inputs`` as arrays of the numbers they hold: bfloat16 bit patterns decoded, the
    others as they are (no copy)."""
    types = [a.dtype for a in op.arguments() if a.role == "input"]
    return tuple(from_bfloat16(x) if t == "bfloat16" else x
                 for x, t in zip(inputs, types, strict=True))
