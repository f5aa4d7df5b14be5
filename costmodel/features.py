"""The cost model's feature vector for (op, schedule, hardware): fixed layout, versioned.

One layout serves every op family: matmul-family and conv2d-family columns sit side by side
and are NaN where they do not apply (XGBoost learns a default direction for missing values).
Sizes are ``log2(1 + x)`` so trees split on ratios, not on absolute sizes that differ
between operators. The groups of columns (see docs/COSTMODEL.md for the full table):

* **op**: kind one-hot; dims as an equivalent GEMM (``b x m x n x k``; conv2d as implicit
  GEMM per image and group: ``m = F/groups``, ``n = P*Q``, ``k = C/groups*R*S``); layout,
  sharing and epilogue flags; FLOPs, minimum bytes and their ratio; conv2d's own dims.
* **hardware**: lanes, vector registers, cores, cache sizes (and this core's L3 share),
  line size, associativity, ISA one-hot, nominal peak.
* **knobs**: every knob raw, the block sizes also as logs, enumerations one-hot.
* **analytic**: the register micro-tile (accumulators, register pressure, FMAs per load,
  micro-kernel efficiency), edge-tile efficiency in the broadcast (M) and vector (N)
  directions, block counts and block padding, footprints relative to L1 / L2 / L3, bytes
  moved at each level and the arithmetic intensity there, packing bytes, parallel balance
  and work units per thread, and the tiler's own roofline estimate (time, GFLOP/s,
  efficiency against peak, and its compute / memory / overhead parts).

Bump :data:`FEATURE_VERSION` whenever a column is added, removed, reordered or computed
differently (including a change of :mod:`tunecache.costmodel.analytic`, whose numbers are
features): a saved model records the version it was trained with and is refused by code
with another one. ``tests/test_costmodel_features.py`` holds a hash of the names and golden
values that fail until the version is bumped.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import (
    Conv2dSchedule,
    MatmulSchedule,
    Schedule,
    is_depthwise,
    problems,
    schedule_from_json,
)
from tunecache.costmodel import analytic

# 3: the depthwise plane kernel (direct, pack_w=0) became legal, with its own estimate.
# 4: the conv2d estimate assumes weights packed once (codegen v2 times conv2d that way).
FEATURE_VERSION = 4

# Whether analytic.estimate covers conv2d (it does since feature version 2). Switching it
# changes feature values: bump FEATURE_VERSION with it.
CONV_ESTIMATE = True

_OP_NAMES = (
    "kind_matmul", "kind_batch_matmul", "kind_conv2d",
    "log_gemm_b", "log_gemm_m", "log_gemm_n", "log_gemm_k",
    "trans_a", "trans_b", "shared_a", "shared_b",
    "epi_bias", "epi_relu", "epi_add",
    "log_flops", "log_min_bytes", "log_min_intensity",
    "log_conv_n", "log_conv_c", "log_conv_h", "log_conv_w", "log_conv_f",
    "conv_r", "conv_s", "log_conv_p", "log_conv_q",
    "conv_stride_h", "conv_stride_w", "conv_pad_h", "conv_pad_w", "conv_dil_h", "conv_dil_w",
    "log_conv_groups", "conv_depthwise",
)
_HW_NAMES = (
    "hw_lanes", "hw_vector_registers", "hw_cores",
    "log_hw_l1d", "log_hw_l2", "log_hw_l3", "log_hw_l3_share",
    "hw_cache_line", "hw_l1d_ways", "hw_l2_ways", "hw_l3_ways",
    "hw_isa_avx512", "hw_isa_avx2", "log_hw_peak_gflops",
)
_KNOB_NAMES = (
    # matmul family
    "mr", "nr", "nr_vectors", "kc", "mc", "nc", "log_kc", "log_mc", "log_nc",
    "pack_a", "pack_b", "order_ipj", "order_dot", "unroll",
    # conv2d family
    "conv_algo_gemm", "oc_block", "ow_block", "oh_block", "ic_block", "log_ic_block",
    "conv_order_pf", "unroll_kw", "pack_w",
    # both
    "threads", "threads_per_core", "par_m", "par_n", "par_batch", "par_oc", "par_pixel",
)
_CROSS_NAMES = (
    "legal",
    # register micro-tile (conv2d: broadcast rows x vectors of its register tile)
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
    # conv2d blocking
    "conv_ic_eff", "conv_fp_w_l1", "conv_fp_in_l2",
    # the tiler's own estimate
    "est_log_s", "est_log_gflops", "est_efficiency",
    "est_compute_frac", "est_memory_frac", "est_overhead_frac",
    "est_log_compute_s", "est_log_memory_s", "est_log_overhead_s",
)

FEATURE_NAMES: tuple[str, ...] = _OP_NAMES + _HW_NAMES + _KNOB_NAMES + _CROSS_NAMES
"""Column names in vector order."""

NAN = float("nan")


class FeatureError(TunecacheError):
    """Rows that cannot be featurised (missing or unreadable op, schedule or hardware)."""


def names_digest() -> str:
    """A short hash of :data:`FEATURE_NAMES` (the layout), for metadata and golden tests."""
    return hashlib.sha256("\n".join(FEATURE_NAMES).encode()).hexdigest()[:16]


def _l2(x: float) -> float:
    return math.log2(1.0 + x) if x >= 0 else NAN


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _rup(x: int, m: int) -> int:
    return _cdiv(x, m) * m


# -- per-op, per-hardware and per-schedule parts (cached: few distinct values) -------------


def gemm_dims(op: OpSignature) -> tuple[int, int, int, int]:
    """(b, m, n, k) of the op seen as a GEMM; conv2d as implicit GEMM per image and group."""
    d = op.dims_dict
    if op.kind == "conv2d":
        g = d["groups"]
        return (d["N"] * g, d["F"] // g, op.out_h * op.out_w, d["C"] // g * d["R"] * d["S"])
    return (op.batch, d["M"], d["N"], d["K"])


@lru_cache(maxsize=4096)
def _op_part(op: OpSignature) -> tuple[float, ...]:
    b, m, n, k = gemm_dims(op)
    conv = op.kind == "conv2d"
    d = op.dims_dict
    epi = set(op.epilogue)
    if conv:
        conv_part: tuple[float, ...] = (
            _l2(d["N"]), _l2(d["C"]), _l2(d["H"]), _l2(d["W"]), _l2(d["F"]),
            d["R"], d["S"], _l2(op.out_h), _l2(op.out_w),
            d["stride_h"], d["stride_w"], d["pad_t"] + d["pad_b"], d["pad_l"] + d["pad_r"],
            d["dil_h"], d["dil_w"], _l2(d["groups"]), float(is_depthwise(op)),
        )
        layout: tuple[float, ...] = (NAN, NAN, NAN, NAN)
    else:
        conv_part = (NAN,) * 17
        shared = op.shared
        layout = (float(op.trans_a), float(op.trans_b), float(shared == "a"), float(shared == "b"))
    return (
        float(op.kind == "matmul"), float(op.kind == "batch_matmul"), float(conv),
        _l2(b), _l2(m), _l2(n), _l2(k),
        *layout,
        float("bias" in epi), float("relu" in epi), float("add" in epi),
        _l2(op.flops), _l2(op.min_bytes), math.log2(op.flops / op.min_bytes),
        *conv_part,
    )


@lru_cache(maxsize=64)
def _hw_part(hw: HardwareSpec) -> tuple[float, ...]:
    return (
        hw.lanes, hw.vector_registers, hw.cores,
        _l2(hw.l1d_bytes), _l2(hw.l2_bytes), _l2(hw.l3_bytes),
        _l2(hw.l3_bytes / max(1, hw.l3_shared_by)),
        hw.cache_line, hw.l1d_ways, hw.l2_ways, hw.l3_ways,
        float(hw.isa == "avx512"), float(hw.isa == "avx2"),
        _l2(analytic.peak_gflops_per_core(hw) * hw.cores),
    )


def _knob_part(s: Schedule, hw: HardwareSpec) -> tuple[float, ...]:
    par = s.parallel
    onehot = tuple(float(par == axis) for axis in ("m", "n", "batch", "oc", "pixel"))
    threads = (s.threads, s.threads / hw.cores, *onehot)
    if isinstance(s, MatmulSchedule):
        return (
            s.mr, s.nr, s.nr / hw.lanes, s.kc, s.mc, s.nc, _l2(s.kc), _l2(s.mc), _l2(s.nc),
            s.pack_a, s.pack_b, float(s.loop_order == "ipj"), float(s.loop_order == "dot"),
            s.unroll,
            *(NAN,) * 9, *threads,
        )
    return (
        *(NAN,) * 14,
        float(s.algorithm == "gemm"), s.oc_block, s.ow_block, s.oh_block, s.ic_block,
        _l2(s.ic_block), float(s.loop_order == "pf"), s.unroll_kw, getattr(s, "pack_w", 1),
        *threads,
    )


def _balance(items: Sequence[int], threads: int) -> tuple[float, float]:
    """(mean / busiest thread's work, work items per thread) for round-robin items."""
    if threads <= 1 or not items:
        return 1.0, float(len(items))
    loads = [sum(items[t::threads]) for t in range(threads)]
    busiest = max(loads)
    return (sum(loads) / threads / busiest if busiest else 1.0), len(items) / threads


def _matmul_cross(op: OpSignature, s: MatmulSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    b, M, N, K = gemm_dims(op)
    lanes = hw.lanes
    mr, nr, T = s.mr, s.nr, s.threads
    nv = nr / lanes
    acc = mr * nv
    regs = mr * nv + nv + 1
    Mp, Np = _rup(M, mr), _rup(N, nr)
    kc, mc, nc = min(s.kc, K), min(s.mc, Mp), min(s.nc, Np)
    n_ic, n_jc, n_pc = _cdiv(M, mc), _cdiv(N, nc), _cdiv(K, kc)
    flops = 2.0 * b * M * N * K
    l3_share = hw.l3_bytes / max(1, hw.l3_shared_by)
    rep_a, rep_b = (n_jc, 1) if s.loop_order == "jpi" else (1, n_ic)
    # BLIS data flow: a kc x nr B micro-panel sits in L1 while the A block (mc x kc, L2)
    # streams past it; B micro-panels come from the packed B block in L3 once per M block;
    # C is read and written once per K block.
    bytes_l1 = 4.0 * b * Mp * Np * K * (1 / mr + 1 / nr)
    bytes_l2 = 4.0 * b * Mp * K * _cdiv(N, nr)
    bytes_l3 = 4.0 * b * Np * K * n_ic + 8.0 * b * M * N * n_pc
    bytes_mem = 4.0 * b * (M * K * rep_a + K * N * rep_b + M * N * (2 * n_pc - 1))
    bytes_pack = 8.0 * b * (M * K * rep_a * s.pack_a + K * N * rep_b * s.pack_b)
    if T <= 1:
        bal, units = 1.0, 1.0
    elif s.parallel == "batch":
        bal, units = _balance([1] * b, T)
    elif s.parallel == "m":
        bal, units = _balance([_rup(min(mc, M - i * mc), mr) for i in range(n_ic)], T)
    else:
        # The kernel splits each N block's micro-panels over the threads.
        per_block = [_cdiv(min(nc, N - j * nc), nr) for j in range(n_jc)]
        busiest = sum(_cdiv(p, T) for p in per_block)
        bal, units = (sum(per_block) / T / busiest if busiest else 1.0), sum(per_block) / T
    return (
        mr, nv, acc, regs, regs / hw.vector_registers, acc / (mr + nv),
        analytic.micro_efficiency(mr, int(nv)) if nv >= 1 else 0.0,
        M / Mp, N / Np, M / (n_ic * mc), N / (n_jc * nc), K / (n_pc * kc),
        kc, _l2(kc), _l2(mc), _l2(nc),
        _l2(n_ic), _l2(n_jc), _l2(n_pc), _l2(b * n_ic * n_jc * n_pc),
        _l2(b * (Mp // mr) * (Np // nr) * n_pc), _l2(2.0 * mr * nr * kc),
        4.0 * kc * (mr + nr) / hw.l1d_bytes, 4.0 * mc * kc / hw.l2_bytes, 4.0 * kc * nc / l3_share,
        4.0 * kc * (nc + mc * T) / hw.l3_bytes,
        _l2(bytes_l1), _l2(bytes_l2), _l2(bytes_l3), _l2(bytes_mem), _l2(bytes_pack),
        math.log2(flops / bytes_l1), math.log2(flops / bytes_l2), math.log2(flops / bytes_l3),
        math.log2(flops / bytes_mem),
        bal, _l2(units), _l2(flops / T),
        NAN, NAN, NAN,
    )


def _conv_cross(op: OpSignature, s: Conv2dSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    d = op.dims_dict
    lanes = hw.lanes
    T = s.threads
    g = d["groups"]
    P, Q = op.out_h, op.out_w
    cg = d["C"] // g
    dw = is_depthwise(op)
    direct = s.algorithm != "gemm"
    # Register tile: direct = (ow x oh) broadcast rows x oc vectors; gemm = oc rows x pixel
    # vectors. "m" is the broadcast direction, "n" the vector direction.
    if direct:
        rows, vec = s.ow_block * s.oh_block, s.oc_block
        width_n = d["C"] if dw else d["F"] // g
        eff_m = (Q / _rup(Q, s.ow_block)) * (P / _rup(P, s.oh_block))
        eff_n = width_n / _rup(width_n, vec)
        oc_blocks = _cdiv(width_n, vec) * (1 if dw else g)
        pixel_items = d["N"] * _cdiv(P, s.oh_block)
    else:
        rows, vec = s.oc_block, s.ow_block
        fg = d["F"] // g
        eff_m = fg / _rup(fg, rows)
        eff_n = (P * Q) / _rup(P * Q, vec)
        oc_blocks = _cdiv(fg, rows) * g
        pixel_items = d["N"] * g * _cdiv(P * Q, vec)
    nv = vec / lanes
    acc = rows * nv
    regs = acc + nv + 1
    icb = 1 if dw else min(s.ic_block, cg)
    items = oc_blocks if s.parallel == "oc" else pixel_items
    busiest = _cdiv(items, T)
    flops = float(op.flops)
    return (
        rows, nv, acc, regs, regs / hw.vector_registers, acc / (rows + nv),
        analytic.micro_efficiency(rows, int(nv)) if nv >= 1 else 0.0,
        eff_m, eff_n, NAN, NAN, NAN,
        *(NAN,) * 10,
        NAN, NAN, NAN, NAN,
        *(NAN,) * 9,
        items / (busiest * T) if T > 1 else 1.0, _l2(items / T), _l2(flops / T),
        cg / _rup(cg, icb) if not dw else 1.0,
        4.0 * s.oc_block * icb * d["R"] * d["S"] / hw.l1d_bytes,
        4.0 * icb * d["H"] * d["W"] / hw.l2_bytes,
    )


_N_CROSS_BEFORE_EST = len(_CROSS_NAMES) - 9


def _estimate_part(op: OpSignature, s: Schedule, hw: HardwareSpec) -> tuple[float, ...]:
    if isinstance(s, Conv2dSchedule) and not CONV_ESTIMATE:
        return (NAN,) * 9
    try:
        est = analytic.estimate(op, s, hw)
    except (ZeroDivisionError, ValueError, KeyError, TypeError):
        return (NAN,) * 9
    threads = max(1, s.threads)
    peak = analytic.peak_gflops_per_core(hw) * threads
    secs = max(est.seconds, 1e-12)
    return (
        math.log2(secs), _l2(est.gflops), est.gflops / peak,
        est.compute_s / secs, est.memory_s / secs, est.overhead_s / secs,
        math.log2(max(est.compute_s, 1e-12)), math.log2(max(est.memory_s, 1e-12)),
        math.log2(max(est.overhead_s, 1e-12)),
    )


def _cross_part(op: OpSignature, s: Schedule, hw: HardwareSpec) -> tuple[float, ...]:
    legal = not problems(op, s, hw)
    try:
        if isinstance(s, MatmulSchedule) and op.kind in ("matmul", "batch_matmul"):
            cross = _matmul_cross(op, s, hw)
        elif isinstance(s, Conv2dSchedule) and op.kind == "conv2d":
            cross = _conv_cross(op, s, hw)
        else:
            cross = (NAN,) * (_N_CROSS_BEFORE_EST - 1)
    except (ZeroDivisionError, ValueError):
        # Illegal knobs (a zero block, a tile narrower than a vector) still get a row: the
        # model learns from their "legal" flag and their outcome.
        cross = (NAN,) * (_N_CROSS_BEFORE_EST - 1)
    est = _estimate_part(op, s, hw) if legal else (NAN,) * 9
    return (float(legal), *cross, *est)


def _row(op: OpSignature, s: Schedule, hw: HardwareSpec) -> tuple[float, ...]:
    return (*_op_part(op), *_hw_part(hw), *_knob_part(s, hw), *_cross_part(op, s, hw))


def features(op: OpSignature, schedule: Schedule, hw: HardwareSpec) -> np.ndarray:
    """The feature vector (float32, ``len(FEATURE_NAMES)``) of one (op, schedule, hw)."""
    return np.asarray(_row(op, schedule, hw), dtype=np.float32)


def matrix(op: OpSignature, schedules: Sequence[Schedule], hw: HardwareSpec) -> np.ndarray:
    """Feature rows (``len(schedules) x len(FEATURE_NAMES)``, float32) of one op's candidates."""
    out = np.empty((len(schedules), len(FEATURE_NAMES)), dtype=np.float32)
    for i, s in enumerate(schedules):
        out[i] = _row(op, s, hw)
    return out


# -- store frames ---------------------------------------------------------------------------


@lru_cache(maxsize=8192)
def _parse_op(text: str) -> OpSignature:
    return OpSignature.parse(text)


@lru_cache(maxsize=64)
def _parse_hw(text: str) -> HardwareSpec:
    return HardwareSpec.from_json(text)


def _parse_all(values: np.ndarray, parse: Any) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            out.append(None)
            continue
        try:
            out.append(parse(value))
        except TunecacheError:
            out.append(None)
    return out


def feature_matrix(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Features of store rows (``op_text``, ``schedule_json``, ``hw_json`` columns).

    Returns ``(X, ok)``: the float32 matrix (one row per frame row) and a boolean mask of the
    rows that could be featurised; rows whose op, schedule or hardware is missing or
    unreadable are all-NaN with ``ok`` false. Distinct ops, hardware and schedules are parsed
    once and each distinct (op, schedule, hardware) triple is computed once.
    """
    for column in ("op_text", "schedule_json", "hw_json"):
        if column not in df.columns:
            raise FeatureError(f"cannot featurise: the frame has no {column!r} column")
    n = len(df)
    codes = []
    parsed = []
    for column, parse in (("op_text", _parse_op), ("schedule_json", schedule_from_json),
                          ("hw_json", _parse_hw)):
        code, uniques = pd.factorize(df[column].astype(object), use_na_sentinel=True)
        codes.append(code)
        parsed.append(_parse_all(np.asarray(uniques, dtype=object), parse))
    op_c, s_c, hw_c = codes
    ok = (op_c >= 0) & (s_c >= 0) & (hw_c >= 0)
    ops, schedules, hws = parsed
    ok_idx = np.flatnonzero(ok)
    valid = np.array([ops[op_c[i]] is not None and schedules[s_c[i]] is not None
                      and hws[hw_c[i]] is not None for i in ok_idx], dtype=bool)
    ok[ok_idx[~valid]] = False
    X = np.full((n, len(FEATURE_NAMES)), np.nan, dtype=np.float32)
    rows = np.flatnonzero(ok)
    if len(rows) == 0:
        return X, ok
    triple = (op_c[rows].astype(np.int64) * (len(schedules) + 1) + s_c[rows]) * (len(hws) + 1) \
        + hw_c[rows]
    tcode, first = np.unique(triple, return_index=True)
    inverse = np.searchsorted(tcode, triple)
    table = np.empty((len(tcode), len(FEATURE_NAMES)), dtype=np.float32)
    for j, i in enumerate(rows[first]):
        table[j] = _row(ops[op_c[i]], schedules[s_c[i]], hws[hw_c[i]])
    X[rows] = table[inverse]
    return X, ok
