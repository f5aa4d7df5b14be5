"""The analytic performance model: a roofline-style time estimate for (op, schedule, hardware).

The tiler ranks its candidates with it, and the learned cost model uses it (and its parts) as
features. Machine numbers are nominal per core (the spec has no clock or bandwidth): only
ratios between schedules matter for ranking; the absolute scale makes the estimate readable
in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Conv2dSchedule, MatmulSchedule, Schedule

# Nominal machine numbers (per core). Only ratios between candidates matter for ranking; the
# absolute scale makes the estimate readable in milliseconds. FMA: 2 pipes, 4-cycle latency.
NOMINAL_GHZ = 3.0
FMA_PIPES = 2
FMA_LATENCY = 4
BYTES_PER_CYCLE = {"l1": 64.0, "l2": 32.0, "l3": 16.0}
DRAM_GBPS_PER_CORE = 10.0
PACK_GBPS = 12.0  # packing copies per thread (read + write)
CALL_OVERHEAD_S = 1.5e-6
FORK_JOIN_S = 8e-6  # libgomp fork + join on a VM; ~2-3x bare metal
BARRIER_S = 1.5e-6  # an OpenMP barrier on a 2-vCPU VM
BLOCK_OVERHEAD_S = 1e-7
MERGE_S_PER_ELEMENT = 1e-9


@dataclass(frozen=True, slots=True)
class Estimate:
    """The tiler's prediction for one schedule."""

    seconds: float
    gflops: float
    compute_s: float
    memory_s: float
    overhead_s: float

    @property
    def ms(self) -> float:
        return self.seconds * 1e3


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(x: int, m: int) -> int:
    return _ceil_div(x, m) * m


def peak_gflops_per_core(hw: HardwareSpec) -> float:
    return hw.lanes * 2 * FMA_PIPES * NOMINAL_GHZ


def micro_efficiency(mr: int, nv: int) -> float:
    """Fraction of FMA peak a ``mr x (nv vectors)`` micro-kernel can sustain.

    Latency: fewer than FMA_PIPES*FMA_LATENCY independent accumulators leave pipes idle.
    Loads: per k step the kernel loads nv vectors and broadcasts mr scalars for mr*nv FMAs;
    with two load ports a ratio below one FMA per load starves the FMA pipes. A broadcast
    costs about half a vector load (compilers fold it into the FMA as a memory operand;
    measured here, tall one-vector tiles such as 22x16 are among the fastest).
    """
    acc = mr * nv
    latency = min(1.0, acc / (FMA_PIPES * FMA_LATENCY))
    loads = min(1.0, acc / (0.5 * mr + nv))
    return 0.92 * latency * loads


def estimate(op: OpSignature, s: Schedule, hw: HardwareSpec) -> Estimate:
    """Roofline-style time estimate for one schedule of ``op`` on ``hw``."""
    if isinstance(s, Conv2dSchedule):
        return estimate_conv2d(op, s, hw)
    return estimate_matmul(op, s, hw)


def estimate_dot(op: OpSignature, s: MatmulSchedule, hw: HardwareSpec) -> Estimate:
    """Estimate for ``loop_order="dot"``: vector dot products along K, nothing packed.

    Per k step a tile loads mr + nv vectors for mr*nv FMAs (two loads per cycle); each output
    ends with a horizontal sum; B streams from wherever it fits, once per row block of A.
    """
    d = op.dims_dict
    M, N, K, B = d["M"], d["N"], d["K"], op.batch
    T = s.threads
    nv = s.nr // hw.lanes
    peak = peak_gflops_per_core(hw) * 1e9
    loads_per_fma = (s.mr + nv) / (s.mr * nv)
    eff = 0.9 * min(1.0, 1.0 / max(loads_per_fma, 1e-9) / 1.0) * min(1.0, s.mr * nv / 8)
    k_pad = _round_up(K, hw.lanes)
    flops = 2.0 * B * _round_up(M, s.mr) * _round_up(N, nv) * k_pad
    if s.parallel == "batch":
        units = B
    elif s.parallel == "m":
        units = _ceil_div(M, s.mr)
    else:
        units = _ceil_div(N, nv)
    busy = min(T, max(1, units))
    compute_s = flops / (peak * eff * busy)
    # Per output: a horizontal sum, and the K % lanes tail done in scalar code.
    hsum_s = (12.0 + K % hw.lanes) * B * M * N / (NOMINAL_GHZ * 1e9 * busy)
    b_bytes = 4.0 * N * K * (B if op.shared != "b" else 1)
    passes = 1 if 4.0 * min(s.nc, N) * K <= hw.l2_bytes * 0.5 else _ceil_div(M, s.mr)
    l3_share = hw.l3_bytes / max(1, hw.l3_shared_by)
    bw = (BYTES_PER_CYCLE["l3"] * NOMINAL_GHZ * 1e9 if b_bytes <= l3_share * busy
          else DRAM_GBPS_PER_CORE * 1e9)
    memory_s = b_bytes * passes / (bw * busy)
    overhead_s = CALL_OVERHEAD_S + (FORK_JOIN_S if T > 1 else 0.0)
    seconds = max(compute_s, memory_s) + hsum_s + overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, memory_s, overhead_s)


def estimate_matmul(op: OpSignature, s: MatmulSchedule, hw: HardwareSpec) -> Estimate:
    """Roofline-style time estimate for one matmul / batch_matmul schedule."""
    if s.loop_order == "dot":
        return estimate_dot(op, s, hw)
    d = op.dims_dict
    M, N, K, B = d["M"], d["N"], d["K"], op.batch
    mr, nr, T = s.mr, s.nr, s.threads
    kc, mc, nc = min(s.kc, K), min(s.mc, _round_up(M, mr)), min(s.nc, _round_up(N, nr))
    nv = nr // hw.lanes
    ghz = NOMINAL_GHZ
    peak = peak_gflops_per_core(hw) * 1e9
    # Each micro-kernel call loads and stores its C tile and refills the pipeline: amortised
    # over kc rank-1 updates (measured here: kc 256 -> 512 gains ~7% on large squares).
    eff = micro_efficiency(mr, nv) * kc / (kc + 24)

    n_ic, n_jc, n_pc = _ceil_div(M, mc), _ceil_div(N, nc), _ceil_div(K, kc)
    # Capacity: the B micro-panel must survive in L1, the packed A block in L2, the packed B
    # block in this core's share of L3; each miss costs the micro-kernel bandwidth.
    cycles_per_k = mr * nv / FMA_PIPES
    if (kc * nr + kc * mr) * 4 > hw.l1d_bytes * 0.75:
        # The B micro-panel streams from L2 on every k step instead of staying in L1.
        need = nr * 4 / cycles_per_k
        eff *= min(1.0, BYTES_PER_CYCLE["l2"] / need) * 0.97
    if mc * kc * 4 > hw.l2_bytes * 0.75:
        need = mr * 4 / cycles_per_k
        eff *= min(1.0, BYTES_PER_CYCLE["l3"] / need) * 0.95
    l3_share = hw.l3_bytes / max(1, hw.l3_shared_by)
    if kc * nc * 4 > l3_share * 0.75:
        eff *= 0.9
    if not s.pack_b:
        eff *= 0.93  # strided B rows: more cache lines and TLB pages per micro-panel
    if not s.pack_a:
        eff *= 0.95

    # Work on the busiest thread, in padded micro-tiles.
    Mp, Np = _round_up(M, mr), _round_up(N, nr)
    if T == 1:
        rows, cols, items = Mp, Np, B
    elif s.parallel == "batch":
        rows, cols, items = Mp, Np, _ceil_div(B, T)
    elif s.parallel == "m":
        sizes = [_round_up(min(mc, M - i * mc), mr) for i in range(n_ic)]
        rows = max(sum(sizes[t::T]) for t in range(T)) if sizes else Mp
        cols, items = Np, B
    else:
        panels = [_ceil_div(min(nc, N - j * nc), nr) for j in range(n_jc)]
        cols = sum(_ceil_div(p, T) for p in panels) * nr
        rows, items = Mp, B
    compute_s = 2.0 * items * rows * cols * K / (peak * eff)

    # Bytes each thread moves beyond the micro-kernel's own streams.
    pack_bytes = 0.0
    if s.pack_a:
        repeats = n_jc if s.loop_order == "jpi" else 1
        share = T if (s.parallel in ("m", "n", "batch") and T > 1) else 1
        pack_bytes += 8.0 * M * K * repeats * B / share * (1.5 if not op.trans_a else 1.0)
    if s.pack_b:
        repeats = 1 if s.loop_order == "jpi" else n_ic
        share = T if T > 1 else 1
        pack_bytes += 8.0 * K * N * repeats * B / share * (2.0 if op.trans_b else 1.0)
    else:
        pack_bytes += 0.0
    pack_s = pack_bytes / (PACK_GBPS * 1e9)
    c_bytes = 8.0 * M * N * n_pc * B / T
    c_bw = BYTES_PER_CYCLE["l2" if hw.l2_bytes >= M * N * 4 else "l3"] * ghz * 1e9
    total_bytes = op.min_bytes
    if total_bytes > l3_share * T:
        floor_s = total_bytes / (DRAM_GBPS_PER_CORE * 1e9 * T)
    else:
        floor_s = total_bytes / (BYTES_PER_CYCLE["l3"] * ghz * 1e9 * T)
    memory_s = pack_s + c_bytes / c_bw

    edge_elements = (Mp * Np - M * N) if (Mp != M or Np != N) else 0
    merge_s = MERGE_S_PER_ELEMENT * (edge_elements + (Mp - M) * 0) * n_pc * B / T
    blocks = n_jc * n_pc * n_ic * B
    overhead_s = CALL_OVERHEAD_S + BLOCK_OVERHEAD_S * blocks / T + merge_s
    if T > 1:
        overhead_s += FORK_JOIN_S
        if s.parallel != "batch":
            per_pc = 2 if s.parallel == "m" else 2 + 2 * n_ic
            overhead_s += BARRIER_S * n_jc * n_pc * per_pc * B
    seconds = max(compute_s, floor_s) + memory_s + overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, memory_s, overhead_s)




def _conv_dims(op: OpSignature) -> tuple[int, int, int, int, int, int, int, bool]:
    d = op.dims_dict
    groups = d["groups"]
    depthwise = groups == d["C"] and d["F"] == d["C"]
    return (d["N"], groups, d["C"] // groups, d["F"] // groups, op.out_h, op.out_w,
            d["R"] * d["S"], depthwise)


def estimate_conv2d(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> Estimate:
    """Roofline-style estimate for a conv2d schedule, seen as the GEMM it computes.

    Per image and group the convolution is a GEMM of output channels x output pixels x
    (input channels x R x S). ``direct`` keeps pixels in the broadcast dimension and output
    channels in vector lanes (plus converting the input to the blocked layout); ``gemm``
    the other way round (plus building the im2col panels). Depthwise convolutions have one
    input channel per output channel: vector lanes hold channels, and they are bound by
    memory traffic, not FMAs.
    """
    n, groups, cg, fg, p, q, rs, depthwise = _conv_dims(op)
    if depthwise and s.algorithm == "direct" and not s.pack_w:
        return _estimate_plane(op, s, hw)
    d = op.dims_dict
    lanes = hw.lanes
    T = s.threads
    peak = peak_gflops_per_core(hw) * 1e9
    pack_bw = PACK_GBPS * 1e9
    direct = s.algorithm == "direct"
    pixels = p * q
    if depthwise:
        nv = max(1, s.oc_block // lanes)
        rows = s.ow_block * s.oh_block
        # Each FMA needs its own input vector: loads ~ FMAs, so at most half of peak.
        eff = micro_efficiency(rows, nv) * 0.5
        channels = _round_up(d["C"], s.oc_block)
        flops = 2.0 * n * channels * _round_up(q, s.ow_block) * _round_up(p, s.oh_block) * rs
        units = n * (channels // s.oc_block if s.parallel == "oc" else p)
    elif direct:
        nv = max(1, s.oc_block // lanes)
        rows = s.ow_block * s.oh_block
        kc = min(s.ic_block, cg) * rs
        eff = micro_efficiency(rows, nv) * kc / (kc + 24)
        flops = (2.0 * n * groups * _round_up(fg, s.oc_block) * _round_up(q, s.ow_block)
                 * _round_up(p, s.oh_block) * cg * rs)
        units = n * groups * (_ceil_div(fg, s.oc_block) if s.parallel == "oc" else p)
    else:
        nv = max(1, s.ow_block // lanes)
        kc = min(s.ic_block, cg) * rs
        eff = micro_efficiency(s.oc_block, nv) * kc / (kc + 24)
        flops = (2.0 * n * groups * _round_up(fg, s.oc_block) * _round_up(pixels, s.ow_block)
                 * cg * rs)
        units = n * groups * (_ceil_div(fg, s.oc_block) if s.parallel == "oc"
                              else _ceil_div(pixels, s.ow_block))
    busy = min(T, max(1, units))
    balance = units / (_ceil_div(units, busy) * busy) if units else 1.0
    compute_s = flops / (peak * eff * busy * balance)
    in_elems = n * d["C"] * (d["H"] + d["pad_t"] + d["pad_b"]) * (d["W"] + d["pad_l"] + d["pad_r"])
    out_elems = n * d["F"] * pixels
    weights = d["F"] * cg * rs
    # Weights are packed once, when a model is compiled (and tuning times conv2d that way,
    # codegen v2): per call they are only read, once, whatever the layout.
    pack_bytes = 8.0 * in_elems if direct else 8.0 * n * groups * cg * rs * pixels
    memory_s = pack_bytes / (pack_bw * busy) + (8.0 * out_elems + 4.0 * weights) / (
        BYTES_PER_CYCLE["l3"] * NOMINAL_GHZ * 1e9 * busy)
    if depthwise:
        memory_s += 4.0 * in_elems / (BYTES_PER_CYCLE["l3"] * NOMINAL_GHZ * 1e9 * busy)
    overhead_s = CALL_OVERHEAD_S + (FORK_JOIN_S if T > 1 else 0.0)
    seconds = compute_s + memory_s + overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, memory_s, overhead_s)


def _estimate_plane(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> Estimate:
    """The depthwise plane kernel: output columns in the lanes, one unaligned load per FMA
    (at most half of peak), tiles rounded up to whole vectors and rows; the input read once
    from memory and copied into an L2-resident plane (a strided copy when stride_w > 1)."""
    d = op.dims_dict
    n, c, p, q, rs = d["N"], d["C"], op.out_h, op.out_w, d["R"] * d["S"]
    T = s.threads
    nv = max(1, s.ow_block // hw.lanes)
    acc = s.oh_block * nv
    eff = 0.5 * acc / (acc + 1)
    flops = 2.0 * n * c * _round_up(q, s.ow_block) * _round_up(p, s.oh_block) * rs
    units = n * c
    busy = min(T, max(1, units))
    balance = units / (_ceil_div(units, busy) * busy)
    peak = peak_gflops_per_core(hw) * 1e9
    compute_s = flops / (peak * eff * busy * balance)
    in_bytes = 4.0 * n * c * d["H"] * d["W"]
    out_bytes = 4.0 * n * c * p * q
    stream = BYTES_PER_CYCLE["l3"] * NOMINAL_GHZ * 1e9 * busy
    # The plane copy writes into L2: a memcpy per row at stride 1, an element-wise strided
    # copy otherwise (measured on Zen 4: the whole 96-channel 112x112 stride-2 layer runs at
    # about 25 GB/s of input).
    copy = in_bytes * (0.5 if d["stride_w"] == 1 else 1.0) / stream
    memory_s = (in_bytes + out_bytes) / stream + copy
    overhead_s = CALL_OVERHEAD_S + (FORK_JOIN_S if T > 1 else 0.0)
    seconds = compute_s + memory_s + overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, memory_s, overhead_s)
