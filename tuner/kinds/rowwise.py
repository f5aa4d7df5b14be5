"""The tuner's side of the row-wise kinds (``softmax``, ``layernorm``): a small grid of
vectors per step, interleaved rows, unrolling and sweep counts; illegal points (too many
accumulators, a sweep count the kind lacks) are dropped by the legality check."""

from __future__ import annotations

from collections.abc import Iterator

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.rowwise import RowSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import ScheduleData, problems
from tunecache.tuner.kinds import Strata, TunerKind

VECS = (1, 2, 4)
ROWS = (1, 2, 4, 8)
UNROLLS = (1, 2)
PASSES = (2, 3)


def _schedules(op: OpSignature, hw: HardwareSpec, cls: type[RowSchedule], threads: int,
               unrolls: tuple[int, ...]) -> Iterator[RowSchedule]:
    for vec in VECS:
        for rows in ROWS:
            for unroll in unrolls:
                for passes in PASSES:
                    yield cls(vec=vec, unroll=unroll, rows=rows, passes=passes,
                              threads=threads)


def rowwise_kind(name: str, cls: type[RowSchedule]) -> TunerKind:
    """The tuner side of a row-wise kind whose schedule class is ``cls``."""

    def pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[ScheduleData]:
        return _schedules(op, hw, cls, threads, (1,))

    def grid(op: OpSignature, hw: HardwareSpec, threads: int | None) -> Strata:
        t = hw.cores if threads is None else max(1, min(threads, hw.cores))
        strata: Strata = {}
        for s in _schedules(op, hw, cls, t, UNROLLS):
            if not problems(op, s, hw):
                strata.setdefault(tile_key(s), []).append(s)
        return strata

    def tile_key(s: ScheduleData) -> tuple[object, ...]:
        knobs = s.knobs()
        return (knobs["vec"], knobs["rows"])

    def neighbours(op: OpSignature, best: ScheduleData, hw: HardwareSpec) -> list[ScheduleData]:
        knobs = best.knobs()
        out = [best.replace(vec=v) for v in VECS if v != knobs["vec"]]
        out += [best.replace(rows=max(1, knobs["rows"] * 2)),
                best.replace(rows=max(1, knobs["rows"] // 2)),
                best.replace(unroll=2 if knobs["unroll"] == 1 else 1)]
        out += [best.replace(passes=p) for p in PASSES if p != knobs["passes"]]
        return out

    return TunerKind(name=name, pool=pool, tile_key=tile_key, grid=grid, neighbours=neighbours)
