"""The analytical tiler: a small, hardware-aligned set of candidate schedules per operator.

Roller's construction carried to a CPU memory hierarchy. Tiles grow level by level:

1. **Registers.** Micro-tiles ``mr x nr`` with ``nr`` a multiple of the vector lanes and
   accumulators + operand vectors within the register file; ranked by a reuse score (FMAs
   per load, enough independent accumulators to cover FMA latency) times edge-tile waste.
2. **L1 / L2 / L3.** For each good micro-tile, the K block ``kc`` (the B micro-panel stays in
   L1 while A streams), the M block ``mc`` (the packed A block in a share of L2) and the N
   block ``nc`` (the packed B block in a share of L3) come from the BLIS analytical model and
   the larger sizes tuned libraries ship, made padding-tolerant (blocks balanced over the
   dimension) and balanced over threads.
3. **Roofline estimate.** Every complete schedule gets a time estimate from
   :mod:`tunecache.costmodel.analytic`: padded FLOPs at the micro-kernel's efficiency on the
   busiest thread, against the bytes each level must move (packing, C read-modify-write per K
   block, capacity spills), plus fixed overheads.

The top-k by estimate (with at most a few per micro-tile, so one bad guess about the
micro-kernel cannot fill the whole list) are the candidates. Everything is deterministic.

:func:`exhaustive_space` enumerates the legal space on a grid (or a stratified sample of it)
for evaluating the tiler; it is not used for tuning.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule, problems
from tunecache.costmodel.analytic import Estimate, estimate
from tunecache.tuner.kinds import tuner_kind

DEFAULT_K = 10
PER_TILE_CAP = 2
# Estimates this close (relative) are the same to the tiler.
TIE = 0.005
MICRO_TILES_KEPT = 6
T = TypeVar("T")
# Below this many FLOPs per core, fewer threads are candidates too (fork/join costs µs).
SMALL_OP_FLOPS = 20_000_000


@dataclass(frozen=True, slots=True)
class ScoredSchedule:
    """A candidate with its estimate; ``rank`` is 0 for the tiler's top-1."""

    schedule: Schedule
    estimate: Estimate
    rank: int


# -- candidates ----------------------------------------------------------------------------


def thread_options(op: OpSignature, hw: HardwareSpec, threads: int | None) -> list[int]:
    """Thread counts worth trying: the one asked for, else every core and, for ops too small
    to amortise a fork/join, fewer (down to one)."""
    if threads is not None:
        return [max(1, min(threads, hw.cores))]
    options = {hw.cores}
    if op.flops < SMALL_OP_FLOPS * hw.cores:
        t = hw.cores
        while t > 1:
            t //= 2
            options.add(max(1, t))
    return sorted(options, reverse=True)


def candidates(op: OpSignature, hw: HardwareSpec, k: int = DEFAULT_K,
               threads: int | None = None) -> list[ScoredSchedule]:
    """The tiler's top-``k`` legal schedules for ``op`` on ``hw``, best estimate first.

    ``threads`` pins the thread count; by default schedules use every core of ``hw``, and
    for small ops fewer threads compete too (the estimate charges fork/join overhead).
    """
    kind = tuner_kind(op.kind)
    seen: set[Schedule] = set()
    scored: list[tuple[Schedule, Estimate]] = []
    pool = (s for t in thread_options(op, hw, threads) for s in kind.pool(op, hw, t))
    for s in pool:
        if s in seen or problems(op, s, hw):
            continue
        seen.add(s)
        scored.append((s, estimate(op, s, hw)))
    scored = _by_estimate(scored)
    chosen: list[tuple[Schedule, Estimate]] = []
    per_tile: dict[tuple[object, ...], list[float]] = {}
    for s, est in scored:
        kept = per_tile.setdefault(kind.tile_key(s), [])
        if len(kept) < PER_TILE_CAP and not _ties(est.seconds, kept):
            chosen.append((s, est))
            kept.append(est.seconds)
        if len(chosen) == k:
            break
    if len(chosen) < k:
        picked = {s for s, _ in chosen}
        chosen = _by_estimate(chosen + [(s, e) for s, e in scored
                                        if s not in picked][: k - len(chosen)])
    chosen = _with_every_leader(chosen, scored, kind.algorithm)
    return [ScoredSchedule(s, est, rank) for rank, (s, est) in enumerate(chosen)]


def _ties(seconds: float, kept: list[float]) -> bool:
    """Whether a variant's estimate equals one already kept for its register tile: the
    estimate sees no difference between them (a loop order or an unrolling it does not
    model), so a second slot would be spent on a coin flip that refinement makes anyway.
    On the AVX2 Zen 3 VM the NCHW stems' top-10 held three tiles in four tied variants
    each, none the tile that measured fastest (ARCHITECTURE change 57)."""
    return any(abs(seconds - other) <= TIE * other for other in kept)


def _with_every_leader(chosen: list[tuple[Schedule, Estimate]],
                          scored: list[tuple[Schedule, Estimate]],
                          algorithm: Callable[[Schedule], str]) -> list[tuple[Schedule, Estimate]]:
    """``chosen`` with the best-estimated schedule of each algorithm and of each thread count
    in it, each in place of the last one whose algorithm and thread count others share (never
    growing the list): the estimate compares algorithms too poorly to leave one out
    (Strassen at two threads on BERT's 768x768 projections: ranked 74th, measured 5% faster
    than the first), and thread counts of a small op by a fork/join cost that moves with the
    machine's load (a 5x37x53x19 batched matmul: two threads 0.87x one thread's time in one
    run, one thread fastest in others)."""
    keys = leader_keys(algorithm)
    leaders = leaders_of(scored, lambda item: item[0], algorithm)
    missing = [item for item in leaders if item not in chosen]
    if not missing:
        return chosen
    kept = list(chosen)
    for item in missing:
        counts = [Counter(key(s) for s, _ in kept) for key in keys]
        drop = next((i for i in range(len(kept) - 1, -1, -1)
                     if kept[i] not in leaders and _shared(kept[i][0], counts, keys)), None)
        if drop is not None:
            kept[drop] = item
    return _by_estimate(kept)


def _shared(s: Schedule, counts: list[Counter[str]],
            keys: list[Callable[[Schedule], str]]) -> bool:
    """Whether other kept schedules share each of ``s``'s keys (so dropping it loses none)."""
    return all(c[key(s)] > 1 for c, key in zip(counts, keys, strict=True))


def _threads(s: Schedule) -> str:
    return str(s.threads)


def leader_keys(algorithm: Callable[[Schedule], str]) -> list[Callable[[Schedule], str]]:
    """What the top-k and a tuning job keep one of each: algorithms and thread counts."""
    return [algorithm, _threads]


def leaders_of(items: Iterable[T], schedule: Callable[[T], Schedule],
               algorithm: Callable[[Schedule], str]) -> list[T]:
    """The first item of each algorithm, then the first of each thread count not already
    among them, in the items' order within each group."""
    items = list(items)
    found: list[T] = []
    for key in leader_keys(algorithm):
        found += first_of_each(items, _composed(key, schedule))
    return list(dict.fromkeys(found))


def _composed(key: Callable[[Schedule], str], schedule: Callable[[T], Schedule]
              ) -> Callable[[T], str]:
    return lambda item: key(schedule(item))


def first_of_each(items: Iterable[T], key: Callable[[T], str]) -> list[T]:
    """The first item of each ``key`` value, in the items' order."""
    seen: set[str] = set()
    out = []
    for item in items:
        if key(item) not in seen:
            seen.add(key(item))
            out.append(item)
    return out


def _by_estimate(scored: list[tuple[Schedule, Estimate]]) -> list[tuple[Schedule, Estimate]]:
    """Fastest estimate first; equal estimates by ``schedule_id``, computed only for them
    (hashing every schedule's JSON was most of a small op's ranking time)."""
    counts = Counter(est.seconds for _, est in scored)
    return sorted(scored, key=lambda item: (
        item[1].seconds, item[0].schedule_id if counts[item[1].seconds] > 1 else ""))


def timed_candidates(op: OpSignature, hw: HardwareSpec, k: int = DEFAULT_K,
                     threads: int | None = None) -> tuple[list[ScoredSchedule], float]:
    """:func:`candidates` plus the seconds it took (for reports)."""
    start = time.perf_counter()
    out = candidates(op, hw, k, threads)
    return out, time.perf_counter() - start


# -- exhaustive reference ------------------------------------------------------------------


def exhaustive_space(op: OpSignature, hw: HardwareSpec, threads: int | None = None,
                     limit: int | None = None, seed: int = 0) -> list[Schedule]:
    """The legal schedule grid for ``op`` (for evaluation), or a stratified sample of it.

    Matmul: every legal micro-tile, K blocks 64..1024 and K, M blocks from a quarter of L2 to
    balanced-over-threads, N blocks from a share of L3 to all of N, both packings, both loop
    orders, every parallel axis and unroll 1/4. Conv2d: both algorithms, every legal
    register tile on a grid of widths, channel blocks, loop orders, kernel-width unrolling,
    weight packing and parallel axes. With ``limit``, the sample keeps the same share of
    every register tile (stratified), deterministic for ``seed``.
    """
    return stratified(tuner_kind(op.kind).grid(op, hw, threads), limit, seed)


def stratified(strata: dict[tuple[object, ...], list[Schedule]], limit: int | None,
                seed: int) -> list[Schedule]:
    everything = [s for group in strata.values() for s in group]
    if limit is None or len(everything) <= limit:
        return everything
    rng = random.Random(seed)
    total = len(everything)
    sample: list[Schedule] = []
    for key in sorted(strata, key=repr):
        group = strata[key]
        take = max(1, round(limit * len(group) / total))
        sample.extend(rng.sample(group, min(take, len(group))))
    rng.shuffle(sample)
    return sample[:limit]


