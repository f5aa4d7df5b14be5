"""Data-movement ops as native strided copies: no Python between kernels for them.

``Transpose``, ``Concat``, ``Split``, ``Slice`` and ``Expand`` move bytes without
arithmetic. Each becomes one or more steps of the plan runner's strided copy
(``PlanRunner.copy_entry``; the CPU's is ``tc_strided_copy`` in
:mod:`~tunecache.compiler.backends.cpu.runner`), whose parameters are plain data (an
``int64`` block, a constant of the program): per output dim its size and the byte strides of source
and destination, with byte offsets into both. A Concat is one copy per input into its slice
of the output, a Split one copy per output from its slice of the input, a Slice (constant
bounds, any steps) a copy from its first element at its step's stride, an Expand a copy
whose source stride is 0 along broadcast dims.

:func:`copies_of` describes the copies of a step from static shapes, or returns None when
it cannot (another op, a dtype other than float32, a shape it does not know); such a step
stays a numpy bridge. Dims of size 1 are dropped and dims contiguous in both source and
destination merged, so the innermost run is as long as it can be (one ``memcpy``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from tunecache.compiler.graph import FLOAT32, OnnxNode

Shapes = Mapping[str, tuple[tuple[int, ...], np.dtype]]

MAX_DIMS = 8
"""Dims a copy may have after merging (the runner's index vector)."""


@dataclass(frozen=True, slots=True)
class Copy:
    """One strided copy: ``dst[d_off + Σ i·d_stride] = src[s_off + Σ i·s_stride]`` over the
    index space ``shape`` (strides and offsets in bytes)."""

    source: str
    output: str
    shape: tuple[int, ...]
    src_strides: tuple[int, ...]
    dst_strides: tuple[int, ...]
    src_offset: int = 0
    dst_offset: int = 0

    def params(self, item_bytes: int, threads: int = 1) -> np.ndarray:
        """The ``int64`` block ``tc_strided_copy`` reads: ``ndim, item bytes, source
        offset, destination offset, threads``, then sizes, source strides, destination
        strides. A large copy is shared among ``threads``."""
        shape, src, dst = _merged(self.shape, self.src_strides, self.dst_strides)
        head = [len(shape), item_bytes, self.src_offset, self.dst_offset, max(1, threads)]
        return np.array([*head, *shape, *src, *dst], dtype=np.int64)


def copies_of(step: OnnxNode, shapes: Shapes, constants: Mapping[str, np.ndarray]
              ) -> list[Copy] | None:
    """The copies computing ``step``, or None when it is not a data-movement op this
    module knows at these shapes."""
    describe = _OPS.get(step.op_type)
    if describe is None or not step.inputs or not step.inputs[0]:
        return None
    names = [step.inputs[0], *(o for o in step.outputs if o)]
    if step.op_type == "Concat":
        names += [t for t in step.inputs if t]
    if any(n not in shapes or shapes[n][1] != FLOAT32 for n in names):
        return None
    copies = describe(step, shapes, constants)
    if copies is None or any(len(_merged(c.shape, c.src_strides, c.dst_strides)[0]) > MAX_DIMS
                             for c in copies):
        return None
    return copies


def _strides(shape: tuple[int, ...], item: int = 4) -> tuple[int, ...]:
    out, step = [], item
    for size in reversed(shape):
        out.append(step)
        step *= size
    return tuple(reversed(out))


def _axis(step: OnnxNode, rank: int, default: int = 0) -> int | None:
    axis = int(step.attrs.get("axis", default))
    axis = axis + rank if axis < 0 else axis
    return axis if 0 <= axis < rank else None


def _transpose(step: OnnxNode, shapes: Shapes, constants: Mapping[str, np.ndarray]
               ) -> list[Copy] | None:
    source, output = step.inputs[0], step.outputs[0]
    shape = shapes[source][0]
    perm = tuple(int(p) for p in step.attrs.get("perm", range(len(shape))[::-1]))
    if sorted(perm) != list(range(len(shape))):
        return None
    out_shape = tuple(shape[p] for p in perm)
    if out_shape != shapes[output][0]:
        return None
    strides = _strides(shape)
    return [Copy(source, output, out_shape, tuple(strides[p] for p in perm),
                 _strides(out_shape))]


def _along(whole: tuple[int, ...], pieces: list[tuple[int, ...]], axis: int
           ) -> list[int] | None:
    """Where each piece starts along ``axis`` of ``whole`` when the pieces tile it in order
    (their other dims equal to the whole's), else None."""
    starts, at = [], 0
    for piece in pieces:
        if len(piece) != len(whole) or piece[:axis] + piece[axis + 1:] != \
                whole[:axis] + whole[axis + 1:]:
            return None
        starts.append(at)
        at += piece[axis]
    return starts if at == whole[axis] else None


def _concat(step: OnnxNode, shapes: Shapes, constants: Mapping[str, np.ndarray]
            ) -> list[Copy] | None:
    output = step.outputs[0]
    out_shape = shapes[output][0]
    axis = _axis(step, len(out_shape))
    pieces = [shapes[name][0] for name in step.inputs]
    starts = _along(out_shape, pieces, axis) if axis is not None else None
    if axis is None or starts is None:
        return None
    strides = _strides(out_shape)
    return [Copy(name, output, shape, _strides(shape), strides, dst_offset=at * strides[axis])
            for name, shape, at in zip(step.inputs, pieces, starts, strict=True) if shape[axis]]


def _split(step: OnnxNode, shapes: Shapes, constants: Mapping[str, np.ndarray]
           ) -> list[Copy] | None:
    source = step.inputs[0]
    shape = shapes[source][0]
    axis = _axis(step, len(shape))
    if axis is None or not all(step.outputs):  # an unnamed piece: its size is unknown here
        return None
    pieces = [shapes[name][0] for name in step.outputs]
    starts = _along(shape, pieces, axis)
    if starts is None:
        return None
    strides = _strides(shape)
    return [Copy(source, name, piece, strides, _strides(piece), src_offset=at * strides[axis])
            for name, piece, at in zip(step.outputs, pieces, starts, strict=True)]


def _expand(step: OnnxNode, shapes: Shapes, constants: Mapping[str, np.ndarray]
            ) -> list[Copy] | None:
    source, output = step.inputs[0], step.outputs[0]
    shape, out_shape = shapes[source][0], shapes[output][0]
    if len(shape) > len(out_shape):
        return None
    padded = (1,) * (len(out_shape) - len(shape)) + shape
    if any(s not in (1, o) for s, o in zip(padded, out_shape, strict=True)):
        return None
    strides = _strides(padded)
    src = tuple(0 if s == 1 and o != 1 else st
                for s, o, st in zip(padded, out_shape, strides, strict=True))
    return [Copy(source, output, out_shape, src, _strides(out_shape))]


def _slice(step: OnnxNode, shapes: Shapes, constants: Mapping[str, np.ndarray]
           ) -> list[Copy] | None:
    source, output = step.inputs[0], step.outputs[0]
    shape = shapes[source][0]
    bounds = _slice_bounds(step, constants, len(shape))
    if bounds is None:
        return None
    first, step_by = [0] * len(shape), [1] * len(shape)
    sizes = list(shape)
    for axis, (start, end, by) in bounds.items():
        lo, hi, by = slice(start, end, by).indices(shape[axis])
        first[axis], step_by[axis], sizes[axis] = lo, by, len(range(lo, hi, by))
    if tuple(sizes) != shapes[output][0]:
        return None
    strides = _strides(shape)
    src = tuple(s * b for s, b in zip(strides, step_by, strict=True))
    offset = sum(f * s for f, s in zip(first, strides, strict=True))
    return [Copy(source, output, tuple(sizes), src, _strides(tuple(sizes)), src_offset=offset)]


def _slice_bounds(step: OnnxNode, constants: Mapping[str, np.ndarray], rank: int
                  ) -> dict[int, tuple[int, int, int]] | None:
    """``{axis: (start, end, step)}`` of a Slice whose bounds are constants (inputs from
    opset 10, attributes before), or None."""
    if len(step.inputs) >= 3:
        def const(i: int) -> list[int] | None:
            if i >= len(step.inputs) or not step.inputs[i]:
                return None
            value = constants.get(step.inputs[i])
            return None if value is None else [int(v) for v in value.reshape(-1)]
        starts, ends = const(1), const(2)
        axes, steps = const(3), const(4)
        if starts is None or ends is None or (len(step.inputs) > 3 and step.inputs[3]
                                              and axes is None) or \
                (len(step.inputs) > 4 and step.inputs[4] and steps is None):
            return None
    else:
        starts, ends = step.attrs.get("starts"), step.attrs.get("ends")
        axes, steps = step.attrs.get("axes"), None
        if starts is None or ends is None:
            return None
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    out: dict[int, tuple[int, int, int]] = {}
    for start, end, axis, by in zip(starts, ends, axes, steps, strict=True):
        axis = axis + rank if axis < 0 else axis
        if not 0 <= axis < rank or by == 0 or axis in out:
            return None
        out[axis] = (int(start), int(end), int(by))
    return out


_OPS: dict[str, Callable[[OnnxNode, Shapes, Mapping[str, np.ndarray]], list[Copy] | None]] = {
    "Transpose": _transpose,
    "Concat": _concat,
    "Split": _split,
    "Expand": _expand,
    "Slice": _slice,
}


def _merged(shape: tuple[int, ...], src: tuple[int, ...], dst: tuple[int, ...]
            ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Size-1 dims dropped, and a dim merged into the next one where both strides say
    the pair is one run (``stride[d] == stride[d+1] * size[d+1]`` for source and
    destination alike); at least one dim."""
    dims = [(n, s, d) for n, s, d in zip(shape, src, dst, strict=True) if n != 1]
    merged: list[tuple[int, int, int]] = []
    for n, s, d in dims:
        if merged:
            pn, ps, pd = merged[-1]
            if ps == s * n and pd == d * n:
                merged[-1] = (pn * n, s, d)
                continue
        merged.append((n, s, d))
    if not merged:
        merged = [(1, 4, 4)]
    if math.prod(n for n, _, _ in merged) != math.prod(shape):  # pragma: no cover
        raise AssertionError("merging changed the element count")
    return (tuple(n for n, _, _ in merged), tuple(s for _, s, _ in merged),
            tuple(d for _, _, d in merged))
