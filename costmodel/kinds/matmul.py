"""The cost model's side of ``matmul``: the BLIS-style and dot-product estimates, and the
matmul schedule family's feature block (shared with ``batch_matmul``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tunecache.compiler.backends import ArchConstants
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.kinds.matmul import strassen_block
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.costmodel.analytic import (
    Estimate,
    ceil_div,
    constants,
    micro_efficiency,
    peak_gflops_per_core,
    round_up,
)
from tunecache.costmodel.kinds import CostKind, FeatureBlock, l2, register


def estimate_dot(op: OpSignature, s: MatmulSchedule, hw: HardwareSpec) -> Estimate:
    """Estimate for ``loop_order="dot"``: vector dot products along K, nothing packed.

    Per k step a tile loads mr + nv vectors for mr*nv FMAs (two loads per cycle); each output
    ends with a horizontal sum; B streams from wherever it fits, once per row block of A.
    """
    arch = constants(hw)
    d = op.dims_dict
    M, N, K, B = d["M"], d["N"], d["K"], op.batch
    T = s.threads
    nv = s.nr // hw.lanes
    peak = peak_gflops_per_core(hw) * 1e9
    loads_per_fma = (s.mr + nv) / (s.mr * nv)
    eff = 0.9 * min(1.0, 1.0 / max(loads_per_fma, 1e-9) / 1.0) * min(1.0, s.mr * nv / 8)
    k_pad = round_up(K, hw.lanes)
    flops = 2.0 * B * round_up(M, s.mr) * round_up(N, nv) * k_pad
    if s.parallel == "batch":
        units = B
    elif s.parallel == "m":
        units = ceil_div(M, s.mr)
    else:
        units = ceil_div(N, nv)
    busy = min(T, max(1, units))
    compute_s = flops / (peak * eff * busy)
    # Per output: a horizontal sum, and the K % lanes tail done in scalar code.
    hsum_s = (12.0 + K % hw.lanes) * B * M * N / (arch.ghz * 1e9 * busy)
    b_bytes = 4.0 * N * K * (B if op.shared != "b" else 1)
    passes = 1 if 4.0 * min(s.nc, N) * K <= hw.l2_bytes * 0.5 else ceil_div(M, s.mr)
    l3_share = hw.l3_bytes / max(1, hw.l3_shared_by)
    bw = (arch.bytes_per_cycle["l3"] * arch.ghz * 1e9 if b_bytes <= l3_share * busy
          else arch.dram_gbps_per_core * 1e9)
    memory_s = b_bytes * passes / (bw * busy)
    overhead_s = arch.call_overhead_s + (arch.fork_join_s if T > 1 else 0.0)
    seconds = max(compute_s, memory_s) + hsum_s + overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, memory_s, overhead_s)


# What a second Strassen level costs beyond what estimate_strassen charges it, as a share of
# its time: its 49 products are a quarter as tall, and the B sums it streams 3.06x the
# weights' bytes, against 1.75x for one level. Measured (benchmarks/strassen.py, the
# tiler's first three of each level, cold weights), two levels ÷ one level: 0.99-1.07 at one
# thread and 1.02-1.13 at two on the AVX-512 Zen 4 VM (mean 1.04), and 1.15-1.36 on BERT's
# FFN at one thread on the AVX-512 Xeon VM (1.14-1.25 with its AVX2 kernels), where the
# estimate had ranked two levels first (ARCHITECTURE change 69). The charge is set past the
# Zen 4 mean: two levels there won by 1.5% at best and lost by up to 36% elsewhere.
SECOND_LEVEL_COST = 0.10


def estimate_strassen(op: OpSignature, s: MatmulSchedule, hw: HardwareSpec) -> Estimate:
    """``levels`` of Strassen: ``7 ** levels`` block products, each estimated as the BLIS
    kernel with the same micro-tile and K block over the whole block (the kernel forms each
    A sum once and adds each tile into the C block buffer, as that kernel packs A and stores
    C), plus writing the buffer's blocks to C. A C block buffer (``4 ** levels`` blocks of
    ``mc`` x ``nc``) and A block that overflow L2 slow every product. Each product streams
    its B sum as the plain kernel streams its weights (``7 ** levels`` blocks of a
    ``4 ** levels``-th of them)."""
    arch = constants(hw)
    count, grid = 7 ** s.strassen, 2 ** s.strassen
    block = strassen_block(op, s.strassen)
    mh, nh = block.dim("M"), block.dim("N")
    whole = s.replace(strassen=0, mc=round_up(mh, s.mr), nc=round_up(nh, s.nr))
    product = estimate_matmul(block, whole, hw)
    once = arch.call_overhead_s + (arch.fork_join_s if s.threads > 1 else 0.0)
    rows = min(s.mc, mh)
    block_bytes = 4 * (grid * grid * rows * min(s.nc, nh) + rows * min(s.kc, block.dim("K")))
    spill = 1.0 if block_bytes <= 0.75 * hw.l2_bytes else 1.1
    if 4.0 * count * rows * block.dim("K") > 0.75 * hw.l2_bytes:
        # Every column block re-reads the row block's A sums of all the products: past L2
        # they stream from L3, which slows the products where memory lags the FMAs (BERT's
        # M=1024 FFN down-projection at two threads: 1.12-1.17x the plain kernel's time).
        spill *= 1.0 + 0.1 * arch.weight_stream_exposed
    write_s = 8.0 * grid * grid * mh * nh / (
        arch.bytes_per_cycle["l2"] * arch.ghz * 1e9 * s.threads)
    c_bytes = 4.0 * op.dim("M") * op.dim("N")
    if c_bytes > 0.75 * hw.l2_bytes:
        # Writing the buffer out is a pass of its own, after the products' compute: where
        # memory does not keep up with the FMAs, a C larger than L2 pays its memory traffic
        # (read for ownership, write back) on top (BERT's M=1024 projection: 8.6% of the
        # kernel's samples in the write-out, ARCHITECTURE change 88).
        write_s += _exposed_stream_s(arch, 2.0 * c_bytes / s.threads)
    compute_s = count * product.compute_s * spill
    memory_s = count * product.memory_s + write_s
    overhead_s = count * (product.overhead_s - once) + once
    seconds = count * (product.seconds - product.overhead_s) * spill + write_s + overhead_s
    seconds *= 1.0 + SECOND_LEVEL_COST * (s.strassen - 1)
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, memory_s, overhead_s)


def _exposed_stream_s(arch: ArchConstants, stream_bytes: float) -> float:
    """The backend's ``weight_stream_exposed`` share of the time the busiest thread takes to
    stream ``stream_bytes`` from memory that compute does not hide (constant weights, or
    Strassen's write-out)."""
    return arch.weight_stream_exposed * stream_bytes / (arch.dram_gbps_per_core * 1e9)


@dataclass(frozen=True, slots=True)
class _Blocking:
    """A blocked schedule's view of the op: its sizes, its cache blocks clipped to the op
    (``kc``, ``mc``, ``nc``), their counts and M and N padded to whole micro-tiles."""

    M: int
    N: int
    K: int
    B: int
    kc: int
    mc: int
    nc: int
    n_ic: int
    n_jc: int
    n_pc: int
    Mp: int
    Np: int


def _blocking(op: OpSignature, s: MatmulSchedule) -> _Blocking:
    d = op.dims_dict
    M, N, K, B = d["M"], d["N"], d["K"], op.batch
    kc, mc, nc = min(s.kc, K), min(s.mc, round_up(M, s.mr)), min(s.nc, round_up(N, s.nr))
    return _Blocking(M, N, K, B, kc, mc, nc, ceil_div(M, mc), ceil_div(N, nc), ceil_div(K, kc),
                     round_up(M, s.mr), round_up(N, s.nr))


def estimate_matmul(op: OpSignature, s: MatmulSchedule, hw: HardwareSpec) -> Estimate:
    """Roofline-style time estimate for one matmul / batch_matmul schedule: the busiest
    thread's compute at the micro-kernel's efficiency (:func:`_efficiency`) or its memory
    floor (:func:`_floor_s`), whichever is longer, plus packing and C traffic
    (:func:`_memory_s`) and the call, block and team overheads (:func:`_overhead_s`)."""
    arch = constants(hw)
    if s.loop_order == "dot":
        return estimate_dot(op, s, hw)
    if s.strassen:
        return estimate_strassen(op, s, hw)
    if s.loop_order == "amx":
        return estimate_tiles(op, s, hw)
    b = _blocking(op, s)
    peak = peak_gflops_per_core(hw) * 1e9
    rows, cols, items = _busiest_share(s, b)
    compute_s = 2.0 * items * rows * cols * b.K / (peak * _efficiency(s, hw, arch, b))
    # The constant weights B are packed once, not by the kernel (prepacked timing).
    prepacked = op_kind(op.kind).prepacked_timing
    # The busiest thread streams its share of the bytes: all of them when the split leaves
    # the other threads idle (parallel="m" at M=1 ran a 50257-wide decode-step matmul on one
    # core of two).
    busiest = items * rows * cols / (b.B * b.Mp * b.Np)
    floor_s = _floor_s(op, s, hw, arch, busiest, prepacked)
    memory_s = _memory_s(op, s, hw, arch, b, cols, prepacked)
    overhead_s = _overhead_s(s, arch, b)
    seconds = max(compute_s, floor_s) + memory_s + overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, memory_s, overhead_s)


TILE_PRODUCT_CYCLES = 16
"""Cycles one AMX tile product (``tdpbusd``, ``tdpbf16ps``: 16 x 16 x 64 bytes) takes."""
TILE_LOAD_CYCLES = 8
"""Cycles one tile load (1 KiB from L1 or L2) costs the product stream. With these two,
BERT-base's 128x3072x768 int8 product at 2x2 tiles (a load per product) estimates 0.15 ms
of tile work, 1x1 tiles (two loads a product) 1.25x that; measured 0.34 and 0.48 ms with
the epilogue (one thread, AMX Xeon)."""
FINISH_CYCLES_PER_VECTOR = 6
"""A finished row's cost per vector of C: convert, the epilogue's steps, store."""


def estimate_tiles(op: OpSignature, s: MatmulSchedule, hw: HardwareSpec) -> Estimate:
    """Estimate for ``loop_order="amx"``: the busiest thread's tile products and loads (rows
    and columns padded to whole tiles, K to whole tile rows of 64 bytes), its rows finished
    by the vector epilogue, and the weights streamed (:func:`_floor_s`), plus the call."""
    arch = constants(hw)
    M, N, K = op.dim("M"), op.dim("N"), op.dim("K")
    tile_k = 64 // op.dtype_bytes
    rows = ceil_div(ceil_div(M, s.mr), s.threads) * s.mr
    cols, steps = round_up(N, s.nr), ceil_div(K, tile_k)
    panels = (rows // s.mr) * (cols // s.nr) * steps
    products = panels * (s.mr // 16) * (s.nr // 16)
    loads = panels * (s.mr // 16 + s.nr // 16)
    hz = arch.ghz * 1e9
    compute_s = (products * TILE_PRODUCT_CYCLES + loads * TILE_LOAD_CYCLES) / hz
    finish_s = min(rows, M) * cols / hw.lanes * FINISH_CYCLES_PER_VECTOR / hz
    pack_s = 4.0 * min(rows, M) * K / (arch.pack_gbps * 1e9)
    prepacked = op_kind(op.kind).prepacked_timing
    floor_s = _floor_s(op, s, hw, arch, min(1.0, rows / max(1, M)), prepacked)
    overhead_s = arch.call_overhead_s + (arch.fork_join_s if s.threads > 1 else 0.0)
    seconds = max(compute_s, floor_s) + finish_s + pack_s + overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, finish_s + pack_s, overhead_s)


def _efficiency(s: MatmulSchedule, hw: HardwareSpec, arch: ArchConstants, b: _Blocking) -> float:
    """The micro-kernel's share of peak under the schedule's blocks."""
    mr, nr, kc, mc, nc = s.mr, s.nr, b.kc, b.mc, b.nc
    nv = nr // hw.lanes
    # Each micro-kernel call loads and stores its C tile and refills the pipeline: amortised
    # over kc rank-1 updates (measured here: kc 256 -> 512 gains ~7% on large squares).
    eff = micro_efficiency(mr, nv, arch) * kc / (kc + 24)
    # Capacity: the B micro-panel must survive in L1, the packed A block in L2, the packed B
    # block in this core's share of L3; each miss costs the micro-kernel bandwidth.
    cycles_per_k = mr * nv / arch.fma_pipes
    if (kc * nr + kc * mr) * 4 > hw.l1d_bytes * 0.75:
        # The B micro-panel streams from L2 on every k step instead of staying in L1.
        need = nr * 4 / cycles_per_k
        eff *= min(1.0, arch.bytes_per_cycle["l2"] / need) * 0.97
    if mc * kc * 4 > hw.l2_bytes * 0.75:
        need = mr * 4 / cycles_per_k
        eff *= min(1.0, arch.bytes_per_cycle["l3"] / need) * 0.95
    l3_share = hw.l3_bytes / max(1, hw.l3_shared_by)
    if kc * nc * 4 > l3_share * 0.75:
        eff *= 0.9
    if not s.pack_b:
        eff *= 0.93  # strided B rows: more cache lines and TLB pages per micro-panel
    if not s.pack_a:
        eff *= 0.95
    return eff


def _busiest_share(s: MatmulSchedule, b: _Blocking) -> tuple[int, int, int]:
    """The busiest thread's work in padded micro-tiles: (rows, columns, batch items)."""
    M, N, T = b.M, b.N, s.threads
    if T == 1:
        return b.Mp, b.Np, b.B
    if s.parallel == "batch":
        return b.Mp, b.Np, ceil_div(b.B, T)
    if s.parallel == "m":
        sizes = [round_up(min(b.mc, M - i * b.mc), s.mr) for i in range(b.n_ic)]
        rows = max(sum(sizes[t::T]) for t in range(T)) if sizes else b.Mp
        return rows, b.Np, b.B
    panels = [ceil_div(min(b.nc, N - j * b.nc), s.nr) for j in range(b.n_jc)]
    return b.Mp, sum(ceil_div(p, T) for p in panels) * s.nr, b.B


def _b_bytes(op: OpSignature) -> float:
    """The bytes of op(B) in all (once when the batch shares it)."""
    d = op.dims_dict
    return float(op.dtype_bytes * d["K"] * d["N"] * (op.batch if op.shared != "b" else 1))


def _floor_s(op: OpSignature, s: MatmulSchedule, hw: HardwareSpec, arch: ArchConstants,
             busiest: float, prepacked: bool) -> float:
    """The time the busiest thread (``busiest``: its share of the work) takes to stream its
    bytes from L3 or memory, whichever holds them."""
    T = s.threads
    l3_share = hw.l3_bytes / max(1, hw.l3_shared_by)
    total_bytes = op.min_bytes
    thread_bytes = total_bytes * busiest
    b_bytes = _b_bytes(op)
    if T > 1 and s.parallel == "m":
        # Splitting rows shares out A and C, not B: every thread streams all of it (GPT-2's
        # LM head at M=8 on two threads: 11.0 ms split by rows, 6.3 ms split by columns).
        thread_bytes = (total_bytes - b_bytes) * busiest + b_bytes
    if total_bytes > l3_share * T:
        floor_s = thread_bytes / (arch.dram_gbps_per_core * 1e9)
    else:
        floor_s = thread_bytes / (arch.bytes_per_cycle["l3"] * arch.ghz * 1e9)
    if T > 1 and s.parallel == "m" and prepacked:
        # A model streams its constant weights from DRAM on every inference, so each
        # thread's pass over B is a DRAM pass, not a read of one copy shared in L3: GPT-2's
        # decode step at batch 8 (M=8, two threads) ran its per-layer matmuls in 22.2 ms
        # split by rows, 16.2 ms split by columns (alone with B warm, rows won: 0.054 ms
        # against 0.088 ms at 768x768).
        floor_s = max(floor_s, b_bytes / (arch.dram_gbps_per_core * 1e9))
    if not s.pack_b and prepacked:
        # Weights read in place stream as kc-long runs of nr floats a row apart: measured
        # 8.4-9.6 GB/s from DRAM for a 768x3072 B at M=1 against 15.8-16.4 GB/s from the
        # panels packed once at compile time (AVX2 Zen 3 VM); a model streams its weights
        # from DRAM on every inference.
        floor_s /= 0.6
    return floor_s


def _memory_s(op: OpSignature, s: MatmulSchedule, hw: HardwareSpec, arch: ArchConstants,
              b: _Blocking, cols: int, prepacked: bool) -> float:
    """Each thread's traffic beyond the micro-kernel's own streams: packing, C once per K
    block and, for constant weights, the share of their stream compute does not hide."""
    M, N, K, B, T = b.M, b.N, b.K, b.B, s.threads
    pack_bytes = 0.0
    if s.pack_a:
        repeats = b.n_jc if s.loop_order == "jpi" else 1
        share = T if (s.parallel in ("m", "n", "batch") and T > 1) else 1
        pack_bytes += 8.0 * M * K * repeats * B / share * (1.5 if not op.trans_a else 1.0)
    if s.pack_b and not prepacked:
        repeats = 1 if s.loop_order == "jpi" else b.n_ic
        share = T if T > 1 else 1
        pack_bytes += 8.0 * K * N * repeats * B / share * (2.0 if op.trans_b else 1.0)
    pack_s = pack_bytes / (arch.pack_gbps * 1e9)
    c_bytes = 8.0 * M * N * b.n_pc * B / T
    c_bw = arch.bytes_per_cycle["l2" if hw.l2_bytes >= M * N * 4 else "l3"] * arch.ghz * 1e9
    memory_s = pack_s + c_bytes / c_bw
    if prepacked:
        # Split by columns, the busiest thread streams its columns' share; else all of B.
        memory_s += _exposed_stream_s(arch, _b_bytes(op) * (cols / b.Np if T > 1
                                                             and s.parallel == "n" else 1.0))
    return memory_s


def _overhead_s(s: MatmulSchedule, arch: ArchConstants, b: _Blocking) -> float:
    """The call, its blocks, the edge tiles' merges and, with threads, the fork/join and the
    barriers between blocks."""
    M, N, Mp, Np, B, T = b.M, b.N, b.Mp, b.Np, b.B, s.threads
    edge_elements = (Mp * Np - M * N) if (Mp != M or Np != N) else 0
    merge_s = arch.merge_s_per_element * (edge_elements + (Mp - M) * 0) * b.n_pc * B / T
    blocks = b.n_jc * b.n_pc * b.n_ic * B
    overhead_s = arch.call_overhead_s + arch.block_overhead_s * blocks / T + merge_s
    if T > 1:
        overhead_s += arch.fork_join_s
        if s.parallel != "batch":
            per_pc = 2 if s.parallel == "m" else 2 + 2 * b.n_ic
            overhead_s += arch.barrier_s * b.n_jc * b.n_pc * per_pc * B
    return overhead_s


def _op_values(op: OpSignature) -> tuple[float, ...]:
    d = op.dims_dict
    shared = op.shared
    return (l2(op.batch), l2(d["M"]), l2(d["N"]), l2(d["K"]),
            float(op.trans_a), float(op.trans_b), float(shared == "a"), float(shared == "b"))


def _knob_values(s: MatmulSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    return (
        s.mr, s.nr, s.nr / hw.lanes, s.kc, s.mc, s.nc, l2(s.kc), l2(s.mc), l2(s.nc),
        s.pack_a, s.pack_b, float(s.loop_order == "ipj"), float(s.loop_order == "dot"),
        s.unroll, *(float(s.parallel == axis) for axis in ("m", "n", "batch")),
        float(s.strassen),
    )


def balance(items: Sequence[int], threads: int) -> tuple[float, float]:
    """(mean / busiest thread's work, work items per thread) for round-robin items."""
    if threads <= 1 or not items:
        return 1.0, float(len(items))
    loads = [sum(items[t::threads]) for t in range(threads)]
    busiest = max(loads)
    return (sum(loads) / threads / busiest if busiest else 1.0), len(items) / threads


def _cross(op: OpSignature, s: MatmulSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    d = op.dims_dict
    b, M, N, K = op.batch, d["M"], d["N"], d["K"]
    lanes = hw.lanes
    mr, nr, T = s.mr, s.nr, s.threads
    nv = nr / lanes
    acc = mr * nv
    regs = mr * nv + nv + 1
    Mp, Np = round_up(M, mr), round_up(N, nr)
    kc, mc, nc = min(s.kc, K), min(s.mc, Mp), min(s.nc, Np)
    n_ic, n_jc, n_pc = ceil_div(M, mc), ceil_div(N, nc), ceil_div(K, kc)
    flops = 2.0 * b * M * N * K
    l3_share = hw.l3_bytes / max(1, hw.l3_shared_by)
    rep_a, rep_b = (n_jc, 1) if s.loop_order == "jpi" else (1, n_ic)
    # BLIS data flow: a kc x nr B micro-panel sits in L1 while the A block (mc x kc, L2)
    # streams past it; B micro-panels come from the packed B block in L3 once per M block;
    # C is read and written once per K block.
    bytes_l1 = 4.0 * b * Mp * Np * K * (1 / mr + 1 / nr)
    bytes_l2 = 4.0 * b * Mp * K * ceil_div(N, nr)
    bytes_l3 = 4.0 * b * Np * K * n_ic + 8.0 * b * M * N * n_pc
    bytes_mem = 4.0 * b * (M * K * rep_a + K * N * rep_b + M * N * (2 * n_pc - 1))
    bytes_pack = 8.0 * b * (M * K * rep_a * s.pack_a + K * N * rep_b * s.pack_b)
    if T <= 1:
        bal, units = 1.0, 1.0
    elif s.parallel == "batch":
        bal, units = balance([1] * b, T)
    elif s.parallel == "m":
        bal, units = balance([round_up(min(mc, M - i * mc), mr) for i in range(n_ic)], T)
    else:
        # The kernel splits each N block's micro-panels over the threads.
        per_block = [ceil_div(min(nc, N - j * nc), nr) for j in range(n_jc)]
        busiest = sum(ceil_div(p, T) for p in per_block)
        bal, units = (sum(per_block) / T / busiest if busiest else 1.0), sum(per_block) / T
    return (
        mr, nv, acc, regs, regs / hw.vector_registers, acc / (mr + nv),
        micro_efficiency(mr, int(nv), constants(hw)) if nv >= 1 else 0.0,
        M / Mp, N / Np, M / (n_ic * mc), N / (n_jc * nc), K / (n_pc * kc),
        kc, l2(kc), l2(mc), l2(nc),
        l2(n_ic), l2(n_jc), l2(n_pc), l2(b * n_ic * n_jc * n_pc),
        l2(b * (Mp // mr) * (Np // nr) * n_pc), l2(2.0 * mr * nr * kc),
        4.0 * kc * (mr + nr) / hw.l1d_bytes, 4.0 * mc * kc / hw.l2_bytes, 4.0 * kc * nc / l3_share,
        4.0 * kc * (nc + mc * T) / hw.l3_bytes,
        l2(bytes_l1), l2(bytes_l2), l2(bytes_l3), l2(bytes_mem), l2(bytes_pack),
        math.log2(flops / bytes_l1), math.log2(flops / bytes_l2), math.log2(flops / bytes_l3),
        math.log2(flops / bytes_mem),
        bal, l2(units), l2(flops / T),
    )



CROSS_NAMES = (
    # register micro-tile
    "tile_rows", "tile_vectors", "accumulators", "registers_used", "register_pressure",
    "fma_per_load", "micro_efficiency",
    # edge tiles: useful fraction of the padded extent (1 = no waste)
    "edge_eff_m", "edge_eff_n", "block_eff_m", "block_eff_n", "block_eff_k",
    # blocking
    "kc_eff", "log_kc_eff", "log_mc_eff", "log_nc_eff",
    "log_blocks_m", "log_blocks_n", "log_blocks_k", "log_blocks_total",
    "log_micro_calls", "log_flops_per_micro_call",
    # footprints relative to capacity
    "fp_l1", "fp_l2", "fp_l3", "fp_l3_total",
    # bytes moved per level and arithmetic intensity there (FLOPs per byte, log2)
    "log_bytes_l1", "log_bytes_l2", "log_bytes_l3", "log_bytes_mem", "log_bytes_pack",
    "log_ai_l1", "log_ai_l2", "log_ai_l3", "log_ai_mem",
    # parallel work
    "parallel_balance", "log_parallel_units", "log_flops_per_thread",
)

FEATURES = FeatureBlock(
    op_names=("log_gemm_b", "log_gemm_m", "log_gemm_n", "log_gemm_k",
              "trans_a", "trans_b", "shared_a", "shared_b"),
    op_values=_op_values,
    knob_names=("mr", "nr", "nr_vectors", "kc", "mc", "nc", "log_kc", "log_mc", "log_nc",
                "pack_a", "pack_b", "order_ipj", "order_dot", "unroll",
                "par_m", "par_n", "par_batch", "strassen"),
    knob_values=_knob_values,
    cross_names=CROSS_NAMES,
    cross_values=_cross,
)

KIND = register(CostKind(name="matmul", estimate=estimate_matmul, features=FEATURES))
