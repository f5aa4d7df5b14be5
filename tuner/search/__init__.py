"""Choosing schedules for one op: the analytical tiler
(:mod:`~tunecache.tuner.search.roller`) and the tune loop around it
(:mod:`~tunecache.tuner.search.tune`: rank, measure, refine)."""

from tunecache.tuner.search.roller import (
    DEFAULT_K,
    MICRO_TILES_KEPT,
    PER_TILE_CAP,
    SMALL_OP_FLOPS,
    ScoredSchedule,
    candidates,
    exhaustive_space,
    stratified,
    thread_options,
    timed_candidates,
)
from tunecache.tuner.search.tune import (
    EXPLORE_SEED,
    POOL_SIZE,
    OpTuneResult,
    Ranker,
    TuneConfig,
    exploration,
    neighbours,
    ranked_candidates,
    tune_op,
)

__all__ = [
    "DEFAULT_K",
    "EXPLORE_SEED",
    "MICRO_TILES_KEPT",
    "PER_TILE_CAP",
    "POOL_SIZE",
    "SMALL_OP_FLOPS",
    "OpTuneResult",
    "Ranker",
    "ScoredSchedule",
    "TuneConfig",
    "candidates",
    "exhaustive_space",
    "exploration",
    "neighbours",
    "ranked_candidates",
    "stratified",
    "thread_options",
    "timed_candidates",
    "tune_op",
]
