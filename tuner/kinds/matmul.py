"""The tuner's side of ``matmul`` (and ``batch_matmul``): BLIS-style micro-tiles and cache
blocks from the analytical model, dot-product tiles for ``C = A·Bᵀ``, and refinement moves.

Tiles grow level by level, Roller's construction carried to a CPU memory hierarchy:
micro-tiles ``mr x nr`` (``nr`` a multiple of the lanes, accumulators + operand vectors within
the register file) ranked by FMAs per load and edge waste; then the K block ``kc`` (the B
micro-panel stays in L1 while A streams), the M block ``mc`` (the packed A block in a share of
L2) and the N block ``nc`` (the packed B block in a share of L3) from the BLIS analytical
model and the larger sizes tuned libraries ship, balanced over the dimension and the threads.
Matmuls of every dimension >= 64 also get one-level Strassen candidates (``strassen=1``),
and those of every dimension >= 128 two-level ones (``strassen=2``), built the same way for
the block product, for the estimate or tuning to weigh.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.matmul import (
    LOWP_PARALLEL,
    lowp_column_block,
    strassen_block,
    tile_dtypes,
)
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import MAX_MR, MAX_NR_VECTORS, Schedule, problems
from tunecache.costmodel.analytic import ceil_div, micro_efficiency, round_up
from tunecache.tuner.kinds import Strata, TunerKind, balanced, register

MICRO_TILES_KEPT = 6

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
            waste = (M / round_up(M, mr)) * (N / round_up(N, nr))
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


def l1_ways_a(hw: HardwareSpec, mr: int, nr: int) -> int:
    """The L1 ways the BLIS L1 model gives A's micro-panel, beside B's (0: the tile is too
    wide for the model: B's panel leaves A less than a way)."""
    return math.floor((hw.l1d_ways - 1) / (1 + nr / mr))


def l1_model_kc(hw: HardwareSpec, mr: int, nr: int) -> int:
    """The BLIS L1 model's K block: A's micro-panel fills its ways, and B's ``kc x nr``
    panel fits the other ways but one. Below one way for A, the B panel alone bounds it:
    a 4x96 tile read 256 here, a B panel of 96 KiB in a 48 KiB L1, and its kc=256 ran no
    faster than kc=384 (ARCHITECTURE change 83)."""
    way = hw.l1d_bytes // hw.l1d_ways
    ways_a = l1_ways_a(hw, mr, nr)
    by_b = (hw.l1d_ways - 1 - ways_a) * way // (nr * 4)
    return min(by_b, ways_a * way // (mr * 4)) if ways_a else by_b


def kc_candidates(op: OpSignature, hw: HardwareSpec, mr: int, nr: int) -> list[int]:
    """K blocks: the BLIS L1 model (B micro-panel resident in L1) and 256/384/512."""
    K = op.dim("K")
    model = l1_model_kc(hw, mr, nr)
    out = []
    for kc in (model, 256, 384, 512):
        kc = balanced(K, max(8, kc), 8) if K > 8 else K
        out.append(min(kc, K))
    return sorted(set(out))


def mc_candidates(op: OpSignature, hw: HardwareSpec, mr: int, kc: int, threads: int) -> list[int]:
    """M blocks: the packed A block in half of L2, and blocks balanced over the threads."""
    M = op.dim("M")
    l2_rows = max(mr, (hw.l2_bytes // 2) // (kc * 4) // mr * mr)
    out = {balanced(M, l2_rows, mr)}
    if threads > 1:
        per_thread = round_up(ceil_div(M, threads), mr)
        out.add(min(per_thread, l2_rows) if per_thread > l2_rows else per_thread)
    return sorted(out)


def nc_candidates(op: OpSignature, hw: HardwareSpec, nr: int, kc: int) -> list[int]:
    """N blocks: the packed B block in a share of L3 (or all of N when it fits); for int8
    and bf16, whose row tiles sweep the block's panels from L2, the block L2 holds."""
    N = op.dim("N")
    if op.dtype != "float32":
        return [lowp_column_block(op, hw, nr)]
    share = hw.l3_bytes // max(1, hw.l3_shared_by)
    cols = max(nr, (share // 2) // (kc * 4) // nr * nr)
    return [balanced(N, min(cols, 8192 // nr * nr), nr)]


def _parallel_axes(op: OpSignature, threads: int) -> list[str]:
    if threads == 1:
        return ["m"]
    axes = ["m", "n"]
    if "B" in op.dims_dict:
        axes.insert(0, "batch")
    return axes


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
            for rows in sorted({round_up(min(d["N"], l2_rows), nr), round_up(d["N"], nr)}):
                for par in _parallel_axes(op, threads):
                    yield MatmulSchedule(mr=mr, nr=nr, kc=min(d["K"], 512), mc=mr,
                                         nc=min(rows, 65536 // nr * nr), pack_a=0, pack_b=0,
                                         loop_order="dot", threads=threads, parallel=par)


STRASSEN_FROM = {1: 64, 2: 128}
"""Strassen candidates of each level start where every dimension is at least this: below
it the block products are too small to run near peak and the saved FLOPs are lost to the
additions (two levels: BERT's FFN down-projection at sequence 128, 32 x 192 x 768 blocks,
ran 7% faster than one level; its 768x768 projections 2%)."""


TWO_LEVELS_MAX_WEIGHT_BYTES = 32 << 20
"""Two levels' B sums take 3.06x the weights' bytes (one level's 1.75x): past this weight
size the memory is not worth the few percent (GPT-2's 154 MB LM head: 3.7% faster for 200
MB more)."""


def _strassen_levels(op: OpSignature) -> list[int]:
    """The Strassen levels the tiler proposes for ``op``: none for a batch_matmul (its B is
    not constant weights), else those whose :data:`STRASSEN_FROM` every dimension reaches,
    two levels only for weights up to :data:`TWO_LEVELS_MAX_WEIGHT_BYTES`."""
    if "B" in op.dims_dict:
        return []
    least = min(op.dim(n) for n in ("M", "N", "K"))
    weight_bytes = 4 * op.dim("K") * op.dim("N")
    return [level for level, start in STRASSEN_FROM.items() if least >= start
            and (level < 2 or weight_bytes <= TWO_LEVELS_MAX_WEIGHT_BYTES)]


def _strassen_pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[MatmulSchedule]:
    """Strassen over a constant-weights matmul, at each level: the block product's
    micro-tiles and K blocks; the C block buffer (``4 ** levels`` blocks of ``mc`` x ``nc``)
    and the A block in half of L2."""
    for level in _strassen_levels(op):
        block = strassen_block(op, level)
        mh, nh = block.dim("M"), block.dim("N")
        share = 4 * 4 ** level
        for mr, nr in kept_micro_tiles(block, hw)[:MICRO_TILES_KEPT // 2]:
            for kc in kc_candidates(block, hw, mr, nr):
                mc = balanced(mh, max(mr, hw.l2_bytes // 4 // (kc * 4) // mr * mr), mr)
                nc = balanced(nh, max(nr, hw.l2_bytes // 4 // (share * mc) // nr * nr), nr)
                yield MatmulSchedule(mr=mr, nr=nr, kc=kc, mc=mc, nc=nc, threads=threads,
                                     parallel="n" if threads > 1 else "m", strassen=level)


TILE_SHAPES = ((32, 32), (16, 32), (32, 16), (16, 48), (16, 16))
"""AMX tiles of C (``mr x nr``) within the eight tile registers, best first: 2x2 tiles
load four tiles for four products each K step. BERT-base's 128x3072x768 int8 product ran
0.34 ms at 32x32, 0.38-0.41 at 32x16, 16x32 and 16x48, 0.48 at 16x16 (one thread, AMX
Xeon)."""


def _tile_pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[MatmulSchedule]:
    """Matrix-tile (AMX) schedules of an int8 or bf16 matmul where ``hw`` has the tiles."""
    if op.dtype not in tile_dtypes(hw):
        return
    for mr, nr in TILE_SHAPES:
        for parallel in LOWP_PARALLEL if threads > 1 else ("m",):
            yield MatmulSchedule(mr=mr, nr=nr, kc=min(op.dim("K"), 512), mc=mr,
                                 nc=lowp_column_block(op, hw, nr), pack_a=0, pack_b=1,
                                 loop_order="amx", threads=threads, parallel=parallel)


def _matmul_pool(op: OpSignature, hw: HardwareSpec, threads: int) -> Iterator[Schedule]:
    yield from _tile_pool(op, hw, threads)
    yield from _pool(op, hw, threads)
    yield from _strassen_pool(op, hw, threads)
    yield from _dot_pool(op, hw, threads)


def _tile_key(s: MatmulSchedule) -> tuple[object, ...]:
    return (s.loop_order == "dot", s.loop_order == "amx", s.strassen, s.mr, s.nr)


def _grid(op: OpSignature, hw: HardwareSpec, threads: int | None = None) -> Strata:
    """The legal grid, grouped by micro-tile: every legal micro-tile, K blocks 64..1024 and K,
    M blocks from a quarter of L2 to balanced-over-threads, N blocks from a share of L3 to all
    of N, both packings, both loop orders, every parallel axis and unroll 1/4; for layout nt
    also the dot-product tiles."""
    threads = hw.cores if threads is None else max(1, min(threads, hw.cores))
    d = op.dims_dict
    M, N, K = d["M"], d["N"], d["K"]
    lanes, regs = hw.lanes, hw.vector_registers
    strata: Strata = {}
    for nv in range(1, MAX_NR_VECTORS + 1):
        nr = nv * lanes
        for mr in range(1, MAX_MR + 1):
            if mr * nv + nv + 1 > regs:
                break
            if mr > round_up(M, 1) and mr > 1:
                continue
            group: list[MatmulSchedule] = []
            kcs = sorted({min(K, kc) for kc in (64, 128, 256, 384, 512, 768, 1024, K)})
            for kc in kcs:
                l2_rows = max(mr, (hw.l2_bytes // 4) // (kc * 4) // mr * mr)
                mcs = sorted({min(round_up(M, mr), x) for x in
                              (l2_rows, 2 * l2_rows, round_up(ceil_div(M, threads), mr))})
                ncs = sorted({min(round_up(N, nr), x) for x in
                              (nr * 16, nr * 64, round_up(N, nr))})
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
            fast = [s for s in _strassen_grid(op, mr, nr, threads) if not problems(op, s, hw)]
            if fast:
                strata[("strassen", mr, nr)] = fast
    for s in _tile_pool(op, hw, threads):
        strata[("amx", s.mr, s.nr)] = [s]
    if op.attr("layout") == "nt":
        for mr in (1, 2, 4, 8):
            for nv in range(1, MAX_NR_VECTORS + 1):
                nr = nv * lanes
                for nc in sorted({min(round_up(N, nr), x) for x in (nr, nr * 8, round_up(N, nr))}):
                    for par in _parallel_axes(op, threads):
                        s = MatmulSchedule(mr=mr, nr=nr, kc=min(K, 512), mc=mr, nc=nc, pack_a=0,
                                           pack_b=0, loop_order="dot", threads=threads,
                                           parallel=par)
                        if not problems(op, s, hw):
                            strata.setdefault(("dot", mr, nr), []).append(s)
    return strata


def _strassen_grid(op: OpSignature, mr: int, nr: int, threads: int) -> list[MatmulSchedule]:
    """Strassen schedules of one micro-tile at each level: K blocks of the block product, C
    blocks from four micro-panels to the whole block, unroll 1/4."""
    par = "n" if threads > 1 else "m"
    out = []
    for level in _strassen_levels(op):
        block = strassen_block(op, level)
        mh, nh, kh = block.dim("M"), block.dim("N"), block.dim("K")
        out += [MatmulSchedule(mr=mr, nr=nr, kc=kc, mc=mc, nc=nc, unroll=unroll,
                               threads=threads, parallel=par, strassen=level)
                for kc in sorted({min(kh, kc) for kc in (128, 256, 384, 512, kh)})
                for mc in sorted({min(round_up(mh, mr), x) for x in (mr * 8, round_up(mh, mr))})
                for nc in sorted({min(round_up(nh, nr), x) for x in (nr * 4, nr * 16)})
                for unroll in (1, 4)]
    return out


def _neighbours(op: OpSignature, best: MatmulSchedule, hw: HardwareSpec) -> list[MatmulSchedule]:
    """Blocks x/÷ ~1.5, the other unroll, the other parallel axes, the other B packing, and
    the same micro-tile with Strassen switched."""
    K = op.dim("K")
    out: list[MatmulSchedule] = []
    for kc in (int(best.kc * 1.5), int(best.kc / 1.5), K):
        out.append(best.replace(kc=max(8, min(kc, K))))
    for factor in (2.0, 0.5):
        mc = max(best.mr, int(best.mc * factor) // best.mr * best.mr)
        out.append(best.replace(mc=mc))
    out.append(best.replace(unroll=4 if best.unroll == 1 else 1))
    if best.threads > 1:
        out += [best.replace(parallel=a) for a in _parallel_axes(op, best.threads)
                if a != best.parallel]
    if not op.trans_b:
        out.append(best.replace(pack_b=1 - best.pack_b))
    if best.loop_order != "dot":
        # the same tile at the other Strassen levels the tiler proposes (0: none)
        proposed = _strassen_levels(op)
        out += [best.replace(strassen=level, pack_a=1, pack_b=1, loop_order="jpi",
                             parallel="n" if best.threads > 1 else "m")
                for level in ([0, *proposed] if proposed else []) if level != best.strassen]
    return out


def _in_place_weights(op: OpSignature, s: MatmulSchedule,
                      hw: HardwareSpec) -> list[MatmulSchedule]:
    """The same micro-tile and blocks reading B in place (no Strassen: it packs both), then
    the best one-vector-wide tile reading it in place.

    Read in place, B is not the contiguous micro-panel the L1 model sizes ``kc`` for: each
    k step of an ``nr``-wide tile reads ``nr`` floats from another row of B, so the panel
    L1 has to hold spans ``kc`` rows. A one-vector tile reads one cache line per row. With
    B packed on every call, BERT's 128x768x768 projection ran at 1.30-1.31 ms with 8x16 and
    16x16 tiles in place against 1.32-1.35 ms for the tiler's top-1 (4x96) in place and
    1.36-1.44 ms for its packed top-10 (Zen 4 VM, one thread, 64-byte aligned operands)."""
    if s.pack_b == 0 or s.loop_order == "dot":
        return []
    same = s.replace(pack_a=0, pack_b=0, strassen=0)
    narrow = [(mr, nr) for mr, nr in micro_tiles(op, hw) if nr == hw.lanes]
    if not narrow or s.nr == hw.lanes:
        return [same]
    mr, nr = narrow[0]
    d = op.dims_dict
    return [same, same.replace(mr=mr, nr=nr, kc=kc_candidates(op, hw, mr, nr)[0],
                               mc=balanced(d["M"], s.mc, mr), nc=balanced(d["N"], s.nc, nr))]


def _challengers(op: OpSignature, s: MatmulSchedule,
                 hw: HardwareSpec) -> list[MatmulSchedule]:
    """The BLIS kernel with ``s``'s micro-tile and the K block of the BLIS L1 model (the B
    micro-panel resident in L1), where ``s`` runs another K block or Strassen.

    The estimate amortises each micro-kernel call's C tile over ``kc`` and charges a B
    micro-panel that overflows L1 little, so it ranks 384-512 first. On the AVX-512 Xeon VM
    (L1 48 KiB, shared with a busy sibling thread) BERT-base's 128-row matmuls with their
    weights cold ran 0.89x (128x768x3072) and 0.95x (128x768x768) the time of the top-1
    with the model's kc=128, while kc made no difference to 512^3 and 1024^3 (within 3%)."""
    d = op.dims_dict
    if s.loop_order == "dot" or 4 * op.batch * d["M"] * d["N"] > hw.l2_bytes // 2:
        # A smaller K block passes over C more often: only while C stays in cache (at two
        # threads, BERT's 128x3072 FFN output with kc=128 timed 0.87x alone and ran 1.06x
        # in the model).
        return []
    tiles = [(s.mr, s.nr)]
    if l1_ways_a(hw, s.mr, s.nr) < 1:
        # A tile too wide for the L1 model: also the best tile that fits it (at two
        # threads BERT's 4x96 tops ran 1.15-1.25x the time of 8x48 at kc=128).
        fits = [t for t in kept_micro_tiles(op, hw) if l1_ways_a(hw, *t) >= 1]
        tiles += fits[:1]
    out = []
    for mr, nr in tiles:
        kc = kc_candidates(op, hw, mr, nr)[0]
        if (mr, nr, kc, s.strassen) == (s.mr, s.nr, s.kc, 0):
            continue
        mc = mc_candidates(op, hw, mr, kc, s.threads)[0]
        nc = nc_candidates(op, hw, nr, kc)[0]
        out.append(s.replace(mr=mr, nr=nr, strassen=0, kc=kc, mc=mc, nc=nc, pack_a=1,
                             pack_b=1, loop_order="jpi"))
    return out


def _algorithm(s: MatmulSchedule) -> str:
    return f"strassen{s.strassen}" if s.strassen else ("amx" if s.loop_order == "amx" else "blis")


KIND = register(TunerKind(name="matmul", pool=_matmul_pool, tile_key=_tile_key, grid=_grid,
                          neighbours=_neighbours, algorithm=_algorithm,
                          in_place_weights=_in_place_weights, challengers=_challengers,
                          unseen=lambda s: s.loop_order == "amx"))
