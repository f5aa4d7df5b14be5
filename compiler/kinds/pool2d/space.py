"""The pool2d schedule family: knobs, legal space, default schedule, and the workspace
(row buffers, column reciprocals, ``nt`` stage) a schedule's kernel needs.

Schedule knobs (:class:`Pool2dSchedule`): ``vec`` (1, 2, 4: vectors per step of the
vertical pass and of the global reduction), ``unroll`` (1, 2, 4: unroll of the window loops),
``ow_block`` (output columns per register tile of the horizontal pass: 1, 2 or 4 vectors),
``rows`` (1, 2, 4: output rows per block), ``nt`` (0/1: output rows go through a per-thread
stage and leave it as whole cache lines by non-temporal stores, saving the read-for-ownership
traffic when Y misses the cache), ``threads``. Global pooling takes one-vector ``ow_block``,
``rows=1`` and ``nt=0`` (none applies). Channels are not blocked: an NCHW plane is contiguous
and independent of the others, so grouping them gives no reuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.layouts import channel_block, layout_problems
from tunecache.compiler.mathutil import round_up
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import MAX_PACKED_BYTES, ScheduleData, threads_problem

VEC_CHOICES = (1, 2, 4)
UNROLL_CHOICES = (1, 2, 4)
OW_VECTORS = (1, 2, 4)
ROWS_CHOICES = (1, 2, 4)
ALIGN = 16  # floats: 64 bytes


@dataclass(frozen=True, slots=True)
class Pool2dSchedule(ScheduleData):
    """Knobs of a pool2d kernel (see the module docstring)."""

    family: ClassVar[str] = "pool2d"

    ow_block: int
    vec: int = 1
    unroll: int = 1
    rows: int = 1
    nt: int = 0
    threads: int = 1

    def __str__(self) -> str:
        return (f"ow{self.ow_block} v{self.vec} u{self.unroll} r{self.rows} nt{self.nt} "
                f"t{self.threads}")


def is_blocked(op: OpSignature) -> bool:
    """X and Y are channel-blocked (``nchw{x}c``)."""
    return bool(channel_block(op.attr("layout")))


def is_global(op: OpSignature) -> bool:
    """The window is the whole plane: no padding, no dilation (so ``P = Q = 1``)."""
    d = op.dims_dict
    return (d["R"] == d["H"] and d["S"] == d["W"] and d["dil_h"] == 1 and d["dil_w"] == 1
            and not any(d[k] for k in ("pad_t", "pad_l", "pad_b", "pad_r")))


def row_buffer(op: OpSignature, s: Pool2dSchedule, lanes: int) -> tuple[int, int, int]:
    """(offset of input column 0, floats, output columns rounded to tiles) of the row buffer
    of the horizontal pass: padding value around the ``W`` columns, with room for the widest
    load of the last tile."""
    d = op.dims_dict
    origin = round_up(d["pad_l"], ALIGN)
    tiles = round_up(op.out_w, s.ow_block)
    reach = origin - d["pad_l"] + (tiles - lanes) * d["stride_w"] + (d["S"] - 1) * d["dil_w"] \
        + lanes * d["stride_w"]
    return origin, round_up(max(reach, origin + round_up(d["W"], lanes)), ALIGN), tiles


def _stage_floats(op: OpSignature, s: Pool2dSchedule, lanes: int) -> int:
    """Floats of the staging buffer of ``nt`` (output rows on their way to streaming
    stores): a partial cache line, a block of rows and its last tile's spill, and slack for
    moving a partial line."""
    return round_up(s.rows * op.out_w + s.ow_block + 2 * ALIGN, ALIGN) if s.nt else 0


def workspace_floats(op: OpSignature, s: Pool2dSchedule, lanes: int) -> int:
    """Floats of one thread's workspace: ``rows`` row buffers, the column reciprocals,
    then the staging buffer."""
    if is_global(op):
        return 0
    _, floats, tiles = row_buffer(op, s, lanes)
    return s.rows * floats + round_up(tiles, ALIGN) + _stage_floats(op, s, lanes)


def pool2d_problems(op: OpSignature, s: Pool2dSchedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``s`` is illegal for the pool2d ``op`` on ``hw`` (empty when legal)."""
    found: list[str] = []
    lanes = hw.lanes
    if is_blocked(op):
        return _blocked_problems(op, s, hw)
    if s.vec not in VEC_CHOICES:
        found.append(f"vec={s.vec}; expected one of {', '.join(map(str, VEC_CHOICES))}")
    if s.unroll not in UNROLL_CHOICES:
        found.append(f"unroll={s.unroll}; expected one of {', '.join(map(str, UNROLL_CHOICES))}")
    widths = [v * lanes for v in OW_VECTORS]
    if is_global(op):
        if s.ow_block != lanes:
            found.append(f"ow_block does not apply to global pooling (the window is the whole "
                         f"plane); use {lanes} (one {hw.isa} vector)")
    elif s.ow_block not in widths:
        found.append(f"ow_block={s.ow_block} must be 1, 2 or 4 vectors of {lanes} lanes "
                     f"({', '.join(map(str, widths))} on {hw.isa})")
    if s.rows not in ROWS_CHOICES:
        found.append(f"rows={s.rows}; expected one of {', '.join(map(str, ROWS_CHOICES))}")
    elif s.rows != 1 and is_global(op):
        found.append("rows does not apply to global pooling (one output per plane); use 1")
    if s.nt not in (0, 1):
        found.append(f"nt={s.nt} must be 0 or 1")
    elif s.nt and is_global(op):
        found.append("nt does not apply to global pooling (one float per plane); use 0")
    found += threads_problem(s.threads, hw)
    if not found:
        floats = s.threads * workspace_floats(op, s, lanes)
        if 4 * floats > MAX_PACKED_BYTES:
            found.append(f"row buffers would take {4 * floats >> 20} MiB "
                         f"(> {MAX_PACKED_BYTES >> 20} MiB)")
    return found


def _blocked_problems(op: OpSignature, s: Pool2dSchedule, hw: HardwareSpec) -> list[str]:
    """Legality for a blocked layout: pixels per step, window unroll, threads; the row-buffer
    knobs at their neutral values."""
    found = layout_problems((op.attr("layout"),), hw)
    what = f"layout={op.attr('layout')} (whole pixels are vectors)"
    if s.vec not in VEC_CHOICES:
        found.append(f"vec={s.vec}; expected one of {', '.join(map(str, VEC_CHOICES))}")
    if s.unroll not in UNROLL_CHOICES:
        found.append(f"unroll={s.unroll}; expected one of {', '.join(map(str, UNROLL_CHOICES))}")
    if s.ow_block != hw.lanes:
        found.append(f"ow_block does not apply to {what}; use {hw.lanes} (one {hw.isa} vector)")
    if s.rows != 1:
        found.append(f"rows does not apply to {what}; use 1")
    if s.nt != 0:
        found.append(f"nt does not apply to {what}; use 0")
    return found + threads_problem(s.threads, hw)


def default_pool2d_schedule(op: OpSignature, hw: HardwareSpec, threads: int = 1) -> Pool2dSchedule:
    """Two vectors per step (four for global pooling of large planes), the output tile that
    wastes the fewest columns on the row's last tile (the wider on a tie), blocks of four
    rows, the window loops not unrolled, plain stores (streaming ones measured no faster
    here: the staging they need costs what the saved traffic gains)."""
    lanes = hw.lanes
    if is_blocked(op):
        return Pool2dSchedule(ow_block=lanes, vec=2, threads=threads)
    if is_global(op):
        plane = op.dim("H") * op.dim("W")
        vec = 4 if plane >= 8 * lanes else 2 if plane >= 2 * lanes else 1
        return Pool2dSchedule(ow_block=lanes, vec=vec, threads=threads)
    q = op.out_w
    nv = min(OW_VECTORS, key=lambda v: (round_up(q, v * lanes), -v))
    vec = 2 if op.dim("W") >= 2 * lanes else 1
    return Pool2dSchedule(ow_block=nv * lanes, vec=vec, rows=4, threads=threads)
