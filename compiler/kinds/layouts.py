"""Activation layouts of 4-D tensors, shared by the kinds that take them (conv2d, pool2d,
reorder): plain ``nchw`` and the channel-blocked ``nchw{x}c``.

``nchw{x}c`` stores ``[N][ceil(C/x)][H][W][x]``: channels ``x*b .. x*b + x-1`` of a pixel
are contiguous (one or more vectors), and the lanes of the last block beyond ``C`` hold
zeros. Kernels may rely on those zeros (a convolution multiplies them by zero-padded
weights), and kernels writing a blocked tensor write them. ``x`` is the vector width of the
machine the model runs on (8 floats on AVX2, 16 on AVX-512); the other value is a legal
signature everywhere, so a model can be planned for another machine, and a kernel needs
``x`` to be a multiple of the machine's lanes.

:func:`to_blocked` and :func:`from_blocked` are the numpy conversions every reference uses.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from tunecache.compiler.hardware import HardwareSpec

if TYPE_CHECKING:
    from tunecache.compiler.ops import OpSignature

__all__ = ["BLOCKED", "LAYOUTS", "NCHW", "TILE_ROW_LAYOUT", "channel_block", "from_blocked", "from_layout",
           "layout_problems", "random_tensor", "tensor_shape", "to_blocked", "to_layout",
           "with_attrs"]

NCHW = "nchw"
BLOCKED = ("nchw8c", "nchw16c")
LAYOUTS = (NCHW, *BLOCKED)
"""Every layout the layout plan chooses from, the default (``nchw``) first."""
TILE_ROW_LAYOUT = "nchw32c"
"""Blocks of one matrix-tile row of bfloat16 (64 bytes): a bf16 conv2d on tiles reads such
an X in place, unpacked. Only bf16 conv2ds read and write it, between each other
(:mod:`tunecache.compiler.lowering.bf16` chooses it)."""

_BLOCKS = {"nchw": 0, "nchw8c": 8, "nchw16c": 16, TILE_ROW_LAYOUT: 32}


def channel_block(layout: str) -> int:
    """Channels per block of ``layout``: ``x`` for ``nchw{x}c``, 0 for ``nchw``."""
    try:
        return _BLOCKS[layout]
    except KeyError:
        raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(_BLOCKS)}"
                         ) from None


def tensor_shape(n: int, c: int, h: int, w: int, layout: str) -> tuple[int, ...]:
    """The array shape of a logical ``[n, c, h, w]`` tensor stored in ``layout``."""
    x = channel_block(layout)
    return (n, c, h, w) if not x else (n, -(-c // x), h, w, x)


def to_blocked(t: np.ndarray, block: int) -> np.ndarray:
    """NCHW ``t`` as ``[N][ceil(C/block)][H][W][block]``, channels beyond C zero."""
    n, c, h, w = t.shape
    blocks = -(-c // block)
    padded = np.zeros((n, blocks * block, h, w), dtype=t.dtype)
    padded[:, :c] = t
    return np.ascontiguousarray(padded.reshape(n, blocks, block, h, w).transpose(0, 1, 3, 4, 2))


def from_blocked(t: np.ndarray, channels: int) -> np.ndarray:
    """The NCHW tensor of ``channels`` channels stored in blocked ``t`` (padding dropped)."""
    n, blocks, h, w, block = t.shape
    full = t.transpose(0, 1, 4, 2, 3).reshape(n, blocks * block, h, w)
    return np.ascontiguousarray(full[:, :channels])


def to_layout(t: np.ndarray, layout: str) -> np.ndarray:
    """NCHW ``t`` stored in ``layout`` (``t`` itself for ``nchw``)."""
    x = channel_block(layout)
    return to_blocked(t, x) if x else t


def from_layout(t: np.ndarray, layout: str, channels: int) -> np.ndarray:
    """The NCHW tensor stored in ``t`` (of ``layout``, ``channels`` channels)."""
    return from_blocked(t, channels) if channel_block(layout) else t


def random_tensor(rng: np.random.Generator, n: int, c: int, h: int, w: int,
                  layout: str) -> np.ndarray:
    """Standard normal float32 values of ``[n, c, h, w]`` in ``layout`` (zero padding
    lanes); for ``nchw`` exactly the draw of ``rng.standard_normal`` on that shape."""
    return to_layout(rng.standard_normal((n, c, h, w), dtype=np.float32), layout)


def layout_problems(layouts: tuple[str, ...], hw: HardwareSpec) -> list[str]:
    """Why kernels on ``hw`` cannot read or write ``layouts`` (empty when they can): a
    block must be a whole number of vectors."""
    found = []
    for layout in dict.fromkeys(layouts):
        x = channel_block(layout)
        if x and x % hw.lanes:
            found.append(f"layout {layout} needs {hw.isa} vectors that divide its {x}-channel "
                         f"blocks ({hw.lanes} lanes do not); use nchw{hw.lanes}c on {hw.isa}")
    return found


def with_attrs(op: OpSignature, **values: str) -> OpSignature:
    """``op`` with the named attributes set (itself when nothing changes); the signature is
    validated again."""
    attrs = tuple((name, values.get(name, value)) for name, value in op.attrs)
    return op if attrs == op.attrs else replace(op, attrs=attrs)
