"""The tuner's side of ``attention``: query blocks (the register tile's rows), key blocks
and the score forms (matrix tiles, in whole tiles of rows, for bf16 ops); illegal points (a
query block taller than ``M``, a key block over twice ``N``, tiles for a float32 op) are
dropped by the legality check."""

from __future__ import annotations

from collections.abc import Iterator

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.attention import K_BLOCKS, MAX_Q_BLOCK, SCORES, AttentionSchedule
from tunecache.compiler.kinds.attention_tiles import TILE_K_BLOCKS, TILE_Q_BLOCKS
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import problems
from tunecache.tuner.kinds import Strata, TunerKind, register

Q_BLOCKS = (1, 2, 3, 4, 6, 8)
"""The tiler's query blocks (the grid and refinement reach every one of 1..8)."""


def _schedules(threads: int, q_blocks: tuple[int, ...]) -> Iterator[AttentionSchedule]:
    """The vector kernels' points over ``q_blocks``, then the tile kernel's (bf16 ops)."""
    for score in SCORES:
        tiles = score == "tiles"
        for q_block in TILE_Q_BLOCKS if tiles else q_blocks:
            for k_block in TILE_K_BLOCKS if tiles else K_BLOCKS:
                yield AttentionSchedule(q_block=q_block, k_block=k_block, score=score,
                                        threads=threads)


def _pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[AttentionSchedule]:
    return _schedules(threads, Q_BLOCKS)


def _tile_key(s: AttentionSchedule) -> tuple[object, ...]:
    return (s.score, s.q_block)


def _grid(op: OpSignature, hw: HardwareSpec, threads: int | None) -> Strata:
    t = hw.cores if threads is None else max(1, min(threads, hw.cores))
    strata: Strata = {}
    for s in _schedules(t, tuple(range(1, MAX_Q_BLOCK + 1))):
        if not problems(op, s, hw):
            strata.setdefault(_tile_key(s), []).append(s)
    return strata


def _neighbours(op: OpSignature, best: AttentionSchedule,
                hw: HardwareSpec) -> list[AttentionSchedule]:
    if best.score == "tiles":
        return [best.replace(q_block=q, k_block=k) for q in TILE_Q_BLOCKS
                for k in TILE_K_BLOCKS if (q, k) != (best.q_block, best.k_block)]
    out = [best.replace(q_block=q) for q in (best.q_block - 1, best.q_block + 1)
           if 1 <= q <= MAX_Q_BLOCK]
    out += [best.replace(k_block=k) for k in (best.k_block // 2, best.k_block * 2)
            if k in K_BLOCKS]
    return out + [best.replace(score=score) for score in SCORES
                  if score not in (best.score, "tiles")]


KIND = register(TunerKind(name="attention", pool=_pool, tile_key=_tile_key, grid=_grid,
                          neighbours=_neighbours))
