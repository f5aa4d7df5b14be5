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

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import (
    MAX_MR,
    MAX_NR_VECTORS,
    MAX_OW_BLOCK,
    Conv2dSchedule,
    MatmulSchedule,
    Schedule,
    is_depthwise,
    problems,
)
from tunecache.costmodel.analytic import Estimate, estimate, micro_efficiency

DEFAULT_K = 10
PER_TILE_CAP = 4
MICRO_TILES_KEPT = 6
# Below this many FLOPs per core, fewer threads are candidates too (fork/join costs µs).
SMALL_OP_FLOPS = 20_000_000


@dataclass(frozen=True, slots=True)
class ScoredSchedule:
    """A candidate with its estimate; ``rank`` is 0 for the tiler's top-1."""

    schedule: Schedule
    estimate: Estimate
    rank: int


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(x: int, m: int) -> int:
    return _ceil_div(x, m) * m


# -- register level ------------------------------------------------------------------------


def micro_tiles(op: OpSignature, hw: HardwareSpec) -> list[tuple[int, int]]:
    """Legal (mr, nr) ranked by micro-efficiency times edge-tile efficiency, best first."""
    d = op.dims_dict
    M, N = d["M"], d["N"]
    lanes, regs = hw.lanes, hw.vector_registers
    scored = []
    for nv in range(1, MAX_NR_VECTORS + 1):
        nr = nv * lanes
        for mr in range(1, MAX_MR + 1):
            if mr * nv + nv + 1 > regs:
                break
            waste = (M / _round_up(M, mr)) * (N / _round_up(N, nr))
            # A tile far larger than the matrix buys nothing; prefer the smaller one.
            score = micro_efficiency(mr, nv) * waste
            scored.append((-round(score, 6), -(mr * nv), mr, nr))
    scored.sort()
    return [(mr, nr) for _, _, mr, nr in scored]


def kept_micro_tiles(op: OpSignature, hw: HardwareSpec) -> list[tuple[int, int]]:
    """The best few micro-tiles overall plus the best two of each vector width, so that the
    estimate, not the register-level score alone, decides between wide and tall tiles."""
    ranked = micro_tiles(op, hw)
    kept = ranked[:MICRO_TILES_KEPT // 2]
    for nv in range(1, 5):
        kept += [t for t in ranked if t[1] == nv * hw.lanes and t not in kept][:2]
    return kept


# -- cache levels --------------------------------------------------------------------------


def _balanced(extent: int, block: int, align: int) -> int:
    """Padding tolerance: the smallest aligned block giving the same number of blocks."""
    block = max(align, min(block, _round_up(extent, align)))
    count = _ceil_div(extent, block)
    return _round_up(_ceil_div(extent, count), align)


def kc_candidates(op: OpSignature, hw: HardwareSpec, mr: int, nr: int) -> list[int]:
    """K blocks: the BLIS L1 model (B micro-panel resident in L1) and 256/384/512."""
    K = op.dim("K")
    line_sets = hw.l1d_bytes // (hw.l1d_ways * hw.cache_line)
    ways_a = max(1, math.floor((hw.l1d_ways - 1) / (1 + nr / mr)))
    model = ways_a * line_sets * hw.cache_line // (mr * 4)
    out = []
    for kc in (model, 256, 384, 512):
        kc = _balanced(K, max(8, kc), 8) if K > 8 else K
        out.append(min(kc, K))
    return sorted(set(out))


def mc_candidates(op: OpSignature, hw: HardwareSpec, mr: int, kc: int, threads: int) -> list[int]:
    """M blocks: the packed A block in half of L2, and blocks balanced over the threads."""
    M = op.dim("M")
    l2_rows = max(mr, (hw.l2_bytes // 2) // (kc * 4) // mr * mr)
    out = {_balanced(M, l2_rows, mr)}
    if threads > 1:
        per_thread = _round_up(_ceil_div(M, threads), mr)
        out.add(min(per_thread, l2_rows) if per_thread > l2_rows else per_thread)
    return sorted(out)


def nc_candidates(op: OpSignature, hw: HardwareSpec, nr: int, kc: int) -> list[int]:
    """N blocks: the packed B block in a share of L3 (or all of N when it fits)."""
    N = op.dim("N")
    share = hw.l3_bytes // max(1, hw.l3_shared_by)
    cols = max(nr, (share // 2) // (kc * 4) // nr * nr)
    return [_balanced(N, min(cols, 8192 // nr * nr), nr)]


# -- candidates ----------------------------------------------------------------------------


def _parallel_axes(op: OpSignature, threads: int) -> list[str]:
    if threads == 1:
        return ["m"]
    axes = ["m", "n"]
    if op.kind == "batch_matmul":
        axes.insert(0, "batch")
    return axes


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


def _pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[MatmulSchedule]:
    d = op.dims_dict
    M, N = d["M"], d["N"]
    a_fits = 4 * M * d["K"] <= hw.l2_bytes // 2
    b_fits = 4 * d["K"] * N <= hw.l2_bytes // 2
    for mr, nr in kept_micro_tiles(op, hw):
        for kc in kc_candidates(op, hw, mr, nr):
            for mc in mc_candidates(op, hw, mr, kc, threads):
                for nc in nc_candidates(op, hw, nr, kc):
                    for par in _parallel_axes(op, threads):
                        # Reading in place pays when the operand is reused little or already
                        # sits in L2 (measured: unpacked A and B win on 256³ and 333x77x129).
                        packs_b = [1] if op.trans_b or (4 * mr < M and not b_fits) else [1, 0]
                        packs_a = [1, 0] if 2 * nr >= N or a_fits else [1]
                        orders = ["jpi", "ipj"] if nc < N and mc < M else ["jpi"]
                        for pack_b in packs_b:
                            for pack_a in packs_a:
                                for order in orders:
                                    yield MatmulSchedule(
                                        mr=mr, nr=nr, kc=kc, mc=mc, nc=nc, pack_a=pack_a,
                                        pack_b=pack_b, loop_order=order, unroll=1,
                                        threads=threads, parallel=par,
                                    )


def _dot_pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[MatmulSchedule]:
    """``C = A·Bᵀ`` as dot products (layout nt): tiles of mr rows of A x nv rows of B."""
    if op.attr("layout") != "nt":
        return
    d = op.dims_dict
    lanes, regs = hw.lanes, hw.vector_registers
    l2_rows = max(1, (hw.l2_bytes // 2) // (4 * d["K"]))
    for mr in (1, 2, 4):
        if mr > 1 and mr > d["M"]:
            break
        for nv in (2, 4, 8):
            if mr * nv + nv + 1 > regs:
                continue
            nr = nv * lanes
            for rows in sorted({_round_up(min(d["N"], l2_rows), nr), _round_up(d["N"], nr)}):
                for par in _parallel_axes(op, threads):
                    yield MatmulSchedule(mr=mr, nr=nr, kc=min(d["K"], 512), mc=mr,
                                         nc=min(rows, 65536 // nr * nr), pack_a=0, pack_b=0,
                                         loop_order="dot", threads=threads, parallel=par)


def _conv_pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[Conv2dSchedule]:
    """Conv2d candidates: direct register tiles (pixels x channel vectors) and, unless
    depthwise, implicit-GEMM tiles (channels x pixel vectors), with channel blocks sized
    so a block's weights stay in L1/L2 and reduction depths like matmul's kc."""
    d = op.dims_dict
    lanes, regs = hw.lanes, hw.vector_registers
    groups = d["groups"]
    cg, fg = d["C"] // groups, d["F"] // groups
    p, q, rs = op.out_h, op.out_w, d["R"] * d["S"]
    depthwise = is_depthwise(op)
    width = d["C"] if depthwise else fg
    pars = ["oc", "pixel"] if threads > 1 else ["oc"]
    for nv in (1, 2):
        if nv > 1 and width <= lanes:
            break
        max_rows = min(MAX_OW_BLOCK, (regs - nv - 1) // nv)
        ows = {min(q, max_rows), _balanced(q, max_rows, 1), _balanced(q, max(1, max_rows // 2), 1)}
        for ow in sorted(ows):
            for oh in (1, 2, 4):
                if ow * oh > max_rows or (oh > 1 and (oh > p or q > max_rows // 2)):
                    continue
                ics = [1] if depthwise else sorted({min(cg, b) for b in (lanes, 64, 256)})
                for ic in ics:
                    for order in ("fp", "pf"):
                        for unroll in ((0, 1) if d["S"] > 1 else (0,)):
                            for par in pars:
                                yield Conv2dSchedule(
                                    oc_block=nv * lanes, ow_block=ow, oh_block=oh, ic_block=ic,
                                    algorithm="direct", loop_order=order, unroll_kw=unroll,
                                    threads=threads, parallel=par)
    if depthwise:
        # The plane kernel: output columns in the lanes, rows of the tile in registers.
        for nv in (1, 2, 4):
            if nv > 1 and (nv - 1) * lanes >= q:
                break
            for oh in (1, 2, 4):
                if oh * nv + 2 > regs or (oh > 1 and oh > p):
                    continue
                for unroll in ((0, 1) if d["S"] > 1 else (0,)):
                    yield Conv2dSchedule(oc_block=lanes, ow_block=nv * lanes, oh_block=oh,
                                         ic_block=1, pack_w=0, unroll_kw=unroll,
                                         threads=threads, parallel="oc")
        return
    for nv in (1, 2, 4):
        max_mr = min(MAX_MR, (regs - nv - 1) // nv)
        for mr in sorted({max_mr, max(1, max_mr // 2), min(max_mr, _round_up(min(fg, 8), 1))}):
            for depth in (256, 512):
                ic = max(1, min(cg, depth // rs))
                for pack_w in (1, 0):
                    for par in pars:
                        yield Conv2dSchedule(
                            oc_block=mr, ow_block=nv * lanes, ic_block=ic, algorithm="gemm",
                            pack_w=pack_w, threads=threads, parallel=par)


def _matmul_pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[Schedule]:
    yield from _pool(op, hw, threads)
    yield from _dot_pool(op, hw, threads)


_POOLS: dict[str, Callable[[OpSignature, HardwareSpec, int], Iterator[Schedule]]] = {
    "matmul": _matmul_pool, "batch_matmul": _matmul_pool, "conv2d": _conv_pool,
}


def _tile_key(s: Schedule) -> tuple[object, ...]:
    if isinstance(s, Conv2dSchedule):
        plane = s.algorithm == "direct" and not s.pack_w
        return ("plane" if plane else s.algorithm, s.oc_block, s.ow_block, s.oh_block)
    return (s.loop_order == "dot", s.mr, s.nr)


def candidates(op: OpSignature, hw: HardwareSpec, k: int = DEFAULT_K,
               threads: int | None = None) -> list[ScoredSchedule]:
    """The tiler's top-``k`` legal schedules for ``op`` on ``hw``, best estimate first.

    ``threads`` pins the thread count; by default schedules use every core of ``hw``, and
    for small ops fewer threads compete too (the estimate charges fork/join overhead).
    """
    make = _POOLS.get(op.kind)
    if make is None:
        raise ValueError(f"the tiler has no model for op kind {op.kind!r}")
    seen: set[Schedule] = set()
    scored: list[tuple[float, str, Schedule, Estimate]] = []
    pool = (s for t in thread_options(op, hw, threads) for s in make(op, hw, t))
    for s in pool:
        if s in seen or problems(op, s, hw):
            continue
        seen.add(s)
        est = estimate(op, s, hw)
        scored.append((est.seconds, s.schedule_id, s, est))
    scored.sort(key=lambda item: (item[0], item[1]))
    chosen: list[tuple[Schedule, Estimate]] = []
    per_tile: dict[tuple[object, ...], int] = {}
    for _, _, s, est in scored:
        key = _tile_key(s)
        if per_tile.get(key, 0) < PER_TILE_CAP:
            chosen.append((s, est))
            per_tile[key] = per_tile.get(key, 0) + 1
        if len(chosen) == k:
            break
    if len(chosen) < k:
        picked = {s for s, _ in chosen}
        chosen += [(s, e) for _, _, s, e in scored if s not in picked][: k - len(chosen)]
        chosen.sort(key=lambda item: (item[1].seconds, item[0].schedule_id))
    return [ScoredSchedule(s, est, rank) for rank, (s, est) in enumerate(chosen)]


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
    if op.kind == "conv2d":
        return _stratified(_conv_strata(op, hw, threads), limit, seed)
    return _matmul_exhaustive(op, hw, threads, limit, seed)


def _stratified(strata: dict[tuple[object, ...], list[Schedule]], limit: int | None,
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


def _conv_strata(op: OpSignature, hw: HardwareSpec, threads: int | None
                 ) -> dict[tuple[object, ...], list[Schedule]]:
    threads = hw.cores if threads is None else max(1, min(threads, hw.cores))
    d = op.dims_dict
    lanes, regs = hw.lanes, hw.vector_registers
    cg = d["C"] // d["groups"]
    rs = d["R"] * d["S"]
    pars = ["oc", "pixel"] if threads > 1 else ["oc"]
    strata: dict[tuple[object, ...], list[Schedule]] = {}

    def add(s: Conv2dSchedule) -> None:
        if not problems(op, s, hw):
            strata.setdefault(_tile_key(s), []).append(s)

    for nv in range(1, 5):
        max_rows = min(MAX_OW_BLOCK, (regs - nv - 1) // nv)
        for ow in sorted({1, 2, 4, 7, 8, 12, 14, 16, 28, max_rows} & set(range(1, max_rows + 1))):
            for oh in (1, 2, 4):
                if ow * oh > max_rows:
                    continue
                for ic in sorted({1, lanes, 32, 64, 128, cg} & set(range(1, cg + 1))):
                    for order in ("fp", "pf"):
                        for unroll in (0, 1):
                            for par in pars:
                                add(Conv2dSchedule(oc_block=nv * lanes, ow_block=ow, oh_block=oh,
                                                   ic_block=ic, algorithm="direct",
                                                   loop_order=order, unroll_kw=unroll,
                                                   threads=threads, parallel=par))
    if is_depthwise(op):
        for nv in range(1, 5):
            for oh in (1, 2, 3, 4, 6, 8):
                for unroll in (0, 1):
                    add(Conv2dSchedule(oc_block=lanes, ow_block=nv * lanes, oh_block=oh,
                                       ic_block=1, pack_w=0, unroll_kw=unroll, threads=threads,
                                       parallel="oc"))
    if not is_depthwise(op):
        for nv in range(1, 5):
            max_mr = min(MAX_MR, (regs - nv - 1) // nv)
            for mr in sorted({1, 2, 4, 6, 8, 12, 14, 16, 24, max_mr} & set(range(1, max_mr + 1))):
                for depth in (64, 128, 256, 512, 1024):
                    for pack_w in (1, 0):
                        for par in pars:
                            add(Conv2dSchedule(oc_block=mr, ow_block=nv * lanes,
                                               ic_block=max(1, min(cg, depth // rs)),
                                               algorithm="gemm", pack_w=pack_w, threads=threads,
                                               parallel=par))
    return {k: list(dict.fromkeys(v)) for k, v in strata.items()}


def _matmul_exhaustive(op: OpSignature, hw: HardwareSpec, threads: int | None = None,
                       limit: int | None = None, seed: int = 0) -> list[Schedule]:
    """The legal schedule grid for ``op`` (for evaluation), or a stratified sample of it.

    The grid covers every legal micro-tile, K blocks 64..1024 and K, M blocks from a quarter
    of L2 to balanced-over-threads, N blocks from a share of L3 to all of N, both packings,
    both loop orders, every parallel axis and unroll 1/4. With ``limit``, the sample keeps
    the same share of every micro-tile (stratified), deterministic for ``seed``.
    """
    threads = hw.cores if threads is None else max(1, min(threads, hw.cores))
    d = op.dims_dict
    M, N, K = d["M"], d["N"], d["K"]
    lanes, regs = hw.lanes, hw.vector_registers
    strata: dict[tuple[object, ...], list[Schedule]] = {}
    for nv in range(1, MAX_NR_VECTORS + 1):
        nr = nv * lanes
        for mr in range(1, MAX_MR + 1):
            if mr * nv + nv + 1 > regs:
                break
            if mr > _round_up(M, 1) and mr > 1:
                continue
            group: list[Schedule] = []
            kcs = sorted({min(K, kc) for kc in (64, 128, 256, 384, 512, 768, 1024, K)})
            for kc in kcs:
                l2_rows = max(mr, (hw.l2_bytes // 4) // (kc * 4) // mr * mr)
                mcs = sorted({min(_round_up(M, mr), x) for x in
                              (l2_rows, 2 * l2_rows, _round_up(_ceil_div(M, threads), mr))})
                ncs = sorted({min(_round_up(N, nr), x) for x in
                              (nr * 16, nr * 64, _round_up(N, nr))})
                for mc in mcs:
                    for nc in ncs:
                        for par in _parallel_axes(op, threads):
                            for pack_a in (1, 0):
                                for pack_b in (1, 0):
                                    for order in ("jpi", "ipj"):
                                        for unroll in (1, 4):
                                            s = MatmulSchedule(
                                                mr=mr, nr=nr, kc=kc, mc=mc, nc=nc,
                                                pack_a=pack_a, pack_b=pack_b, loop_order=order,
                                                unroll=unroll, threads=threads, parallel=par)
                                            if not problems(op, s, hw):
                                                group.append(s)
            if group:
                strata[(mr, nr)] = group
    if op.attr("layout") == "nt":
        for mr in (1, 2, 4, 8):
            for nv in range(1, MAX_NR_VECTORS + 1):
                nr = nv * lanes
                for nc in sorted({min(_round_up(N, nr), x) for x in (nr, nr * 8, _round_up(N, nr))}):
                    for par in _parallel_axes(op, threads):
                        s = MatmulSchedule(mr=mr, nr=nr, kc=min(K, 512), mc=mr, nc=nc, pack_a=0,
                                           pack_b=0, loop_order="dot", threads=threads,
                                           parallel=par)
                        if not problems(op, s, hw):
                            strata.setdefault(("dot", mr, nr), []).append(s)
    return _stratified(strata, limit, seed)
