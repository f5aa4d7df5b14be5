"""The cost model's feature vector for (op, schedule, hardware): fixed layout, versioned.

One layout serves every op kind: it is the union of the columns every registered kind's
:class:`~tunecache.costmodel.kinds.FeatureBlock` fills (``costmodel/kinds/<kind>.py``), and a
column a row's family does not fill is NaN (XGBoost learns a default direction for missing
values). Families fill the same column where it means the same thing (conv2d fills the
``log_gemm_*`` dims as its implicit GEMM, every register-tiled family fills ``tile_rows``).
Sizes are ``log2(1 + x)`` so trees split on ratios, not on absolute sizes that differ
between operators. The groups of columns (see docs/COSTMODEL.md for the full table):

* **op**: kind one-hot and epilogue flags (over the registered kinds); FLOPs, minimum bytes
  and their ratio; then each family's own op columns — for matmul and conv2d the dims as an
  equivalent GEMM (``b x m x n x k``; conv2d as implicit
  GEMM per image and group: ``m = F/groups``, ``n = P*Q``, ``k = C/groups*R*S``), layout
  and sharing flags, conv2d's own dims.
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
from tunecache.compiler.kinds import all_kinds, op_kind
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule, problems, schedule_from_json
from tunecache.costmodel import analytic
from tunecache.costmodel.kinds import NAN, CostKind, all_cost_kinds, cost_kind, l2

# 3: the depthwise plane kernel (direct, pack_w=0) became legal, with its own estimate.
# 4: the conv2d estimate assumes weights packed once (codegen v2 times conv2d that way).
# 5: the layout is the union of the registered kinds' feature blocks (same columns for
#    matmul and conv2d, in another order; conv-only cross columns no longer NaN-padded).
# 6: softmax (the row-wise block: rows, row length, vec/unroll/rows/passes knobs).
# 7: layernorm (its kind column; it fills the row-wise block).
# 8: pool2d (its kind column and block; the streaming roofline).
# 9: elementwise (its kind column and block).
# 10: attention (its kind column and block).
# 11: reorder (its kind column and block) and the layout_in/out_block columns of conv2d and
#     pool2d (0 for nchw: existing columns keep their values).
# 12: rotary (its kind column and block).
# 13: the matmul estimate (and so its analytic columns): B packed once at compile time (no
#     packing per call), weights read in place stream at 0.6 of a packed panel's bandwidth;
#     and micro_efficiency wants 1.5x pipes x latency accumulators (analytic.LATENCY_MARGIN).
# 14: the matmul estimate's memory floor: a split by rows (parallel="m") streams all of B
#     on every thread; and the conv2d estimate of algorithm="winograd" schedules (its
#     analytic columns; ARCHITECTURE change 34).
# 15: the matmul estimate's memory floor: a split by rows with constant (pre-packed) weights
#     makes every thread's pass over B a DRAM pass, as in a model that streams its weights.
# 16: lrn (its kind column and block: lrn_size, log_pixels_per_tile).
# 17: pwdw (its kind column and block: pw_block, band_tiles, log_band_kib).
# 18: the matmul strassen knob (its column, and the estimate of strassen=1 schedules).
# 19: FMAs in flight per ISA (4 at AVX-512: Zen 4 issues one 512-bit FMA per cycle), which
#     moves the analytic columns and the micro_efficiency columns (now the hardware's, not
#     the default constants); implicit-GEMM conv tiles take the matmul's
#     latency margin; a GEMM conv's 1x1 panels cost their read, and split by output channels
#     every thread packs every panel (ARCHITECTURE change 54).
# 20: a broadcast's cost in loads per ISA (1.5 without AVX-512's embedded broadcast) and
#     the matmul's latency margin for direct conv tiles, which move the analytic and
#     micro_efficiency columns at AVX2 and on portable builds; a direct conv's re-read
#     counts the input lines a stride touches (ARCHITECTURE change 56).
# 21: micro_efficiency takes the lower of its latency and load limits, not their product,
#     and a direct conv tile's short reduction overlaps the next tiles' chains; a direct
#     tile's per-call overhead counts its whole reduction plus a little per channel block,
#     and one-channel blocks copy rows (ARCHITECTURE change 57).
# 22: a direct tile of a 1x1 stride-1 unpadded conv runs along the image's flat run of
#     pixels (compiler.kinds.conv2d.space.flat_pixels), which moves its edge-efficiency,
#     split and analytic columns (ARCHITECTURE change 65).
# 23: where the backend says a matmul's weight stream is not hidden (the two-FMA-unit Xeon:
#     ArchConstants.weight_stream_exposed), the busiest thread's share of the weights is
#     charged on top of compute, which moves the matmul's analytic columns on that hardware
#     (ARCHITECTURE change 84).
# 24: where memory is exposed, a Strassen schedule also pays for writing a C larger than L2
#     out of its block buffer and for a row block's A sums that overflow L2, which moves
#     its analytic columns on that hardware at large M (ARCHITECTURE change 88).
# 25: the int8 matmul's ``dequant`` epilogue step appends its column (issue 53).
# 26: the elementwise kind's max, min, erf and qround steps append their columns (a
#     quantize-dequantize pair runs as an element-wise chain, issue 53).
# 27: the hardswish and hardsigmoid epilogue steps (conv2d, elementwise) append their
#     columns (MobileNet-v3, issue 54).
# 28: the mish epilogue step (conv2d, elementwise) and the elementwise kind's prelu, elu and
#     softplus steps append their columns (issue 54).
FEATURE_VERSION = 28


def _union(groups: Sequence[Sequence[str]]) -> tuple[str, ...]:
    out: dict[str, None] = {}
    for names in groups:
        out.update(dict.fromkeys(names))
    return tuple(out)


_COST_KINDS: tuple[CostKind, ...] = all_cost_kinds()
# Epilogue columns keep the order in which the layout first had them: a step a kind gains
# that another kind already had (conv2d's clip6 and silu, elementwise's steps) keeps its
# column; only a step no kind had before appends one (and changes the layout).
_EPILOGUE_ORDER = ("bias", "relu", "add", "sub", "mul", "div", "sigmoid", "tanh", "gelu_erf",
                   "gelu_tanh", "silu", "exp", "neg", "abs", "sqrt", "clip6")
_KIND_EPILOGUES = _union([kind.spec.epilogues for kind in all_kinds()])
_EPILOGUE_STEPS = tuple(s for s in _EPILOGUE_ORDER if s in _KIND_EPILOGUES) + tuple(
    s for s in _KIND_EPILOGUES if s not in _EPILOGUE_ORDER)
_COMMON_OP_NAMES = (
    *(f"kind_{kind.name}" for kind in _COST_KINDS),
    *(f"epi_{step}" for step in _EPILOGUE_STEPS),
    "log_flops", "log_min_bytes", "log_min_intensity",
)
_HW_NAMES = (
    "hw_lanes", "hw_vector_registers", "hw_cores",
    "log_hw_l1d", "log_hw_l2", "log_hw_l3", "log_hw_l3_share",
    "hw_cache_line", "hw_l1d_ways", "hw_l2_ways", "hw_l3_ways",
    "hw_isa_avx512", "hw_isa_avx2", "log_hw_peak_gflops",
)
_EST_NAMES = (
    "est_log_s", "est_log_gflops", "est_efficiency",
    "est_compute_frac", "est_memory_frac", "est_overhead_frac",
    "est_log_compute_s", "est_log_memory_s", "est_log_overhead_s",
)
_COMMON_KNOB_NAMES = ("threads", "threads_per_core")

FEATURE_NAMES: tuple[str, ...] = (
    _COMMON_OP_NAMES
    + _union([k.features.op_names for k in _COST_KINDS])
    + _HW_NAMES
    + _COMMON_KNOB_NAMES
    + _union([k.features.knob_names for k in _COST_KINDS])
    + ("legal",)
    + _union([k.features.cross_names for k in _COST_KINDS])
    + _EST_NAMES
)
"""Column names in vector order."""

_POSITION = {name: i for i, name in enumerate(FEATURE_NAMES)}


def _positions(names: Sequence[str]) -> np.ndarray:
    return np.array([_POSITION[name] for name in names], dtype=np.intp)


class FeatureError(TunecacheError):
    """Rows that cannot be featurised (missing or unreadable op, schedule or hardware)."""


def names_digest() -> str:
    """A short hash of :data:`FEATURE_NAMES` (the layout), for metadata and golden tests."""
    return hashlib.sha256("\n".join(FEATURE_NAMES).encode()).hexdigest()[:16]


# -- per-op, per-hardware and per-schedule parts (cached: few distinct values) -------------


@lru_cache(maxsize=4096)
def _op_part(op: OpSignature) -> tuple[float, ...]:
    epi = set(op.epilogue)
    return (
        *(float(op.kind == kind.name) for kind in _COST_KINDS),
        *(float(step in epi) for step in _EPILOGUE_STEPS),
        l2(op.flops), l2(op.min_bytes), math.log2(op.flops / op.min_bytes),
    )


@lru_cache(maxsize=4096)
def _block_op_part(op: OpSignature) -> tuple[float, ...]:
    return cost_kind(op.kind).features.op_values(op)


@lru_cache(maxsize=64)
def _hw_part(hw: HardwareSpec) -> tuple[float, ...]:
    return (
        hw.lanes, hw.vector_registers, hw.cores,
        l2(hw.l1d_bytes), l2(hw.l2_bytes), l2(hw.l3_bytes),
        l2(hw.l3_bytes / max(1, hw.l3_shared_by)),
        hw.cache_line, hw.l1d_ways, hw.l2_ways, hw.l3_ways,
        # hw_isa_avx512 / hw_isa_avx2, named for the x86 levels that first filled them, are
        # the vector width's one-hot: the same values on every spec, without ISA names here.
        float(hw.vector_bits == 512), float(hw.vector_bits == 256),
        l2(analytic.peak_gflops_per_core(hw) * hw.cores),
    )


def _estimate_part(op: OpSignature, s: Schedule, hw: HardwareSpec) -> tuple[float, ...]:
    try:
        est = analytic.estimate(op, s, hw)
    except (ZeroDivisionError, ValueError, KeyError, TypeError):
        return (NAN,) * len(_EST_NAMES)
    threads = max(1, s.threads)
    peak = analytic.peak_gflops_per_core(hw) * threads
    secs = max(est.seconds, 1e-12)
    return (
        math.log2(secs), l2(est.gflops), est.gflops / peak,
        est.compute_s / secs, est.memory_s / secs, est.overhead_s / secs,
        math.log2(max(est.compute_s, 1e-12)), math.log2(max(est.memory_s, 1e-12)),
        math.log2(max(est.overhead_s, 1e-12)),
    )


def _scatter(kind: CostKind, with_schedule: bool, with_estimate: bool) -> np.ndarray:
    """Positions of one row's values, in the order :func:`_fill` concatenates them."""
    block = kind.features
    names = [*_COMMON_OP_NAMES, *_HW_NAMES, *_COMMON_KNOB_NAMES, "legal", *block.op_names]
    if with_schedule:
        names += [*block.knob_names, *block.cross_names]
    if with_estimate:
        names += _EST_NAMES
    return _positions(names)


_SCATTER = {(kind.name, sched, est): _scatter(kind, sched, est)
            for kind in _COST_KINDS for sched in (False, True) for est in (False, True)}


def _fill(out: np.ndarray, op: OpSignature, s: Schedule, hw: HardwareSpec) -> None:
    """Write the feature row of (op, s, hw) into ``out`` (NaN where nothing applies)."""
    kind = cost_kind(op.kind)
    block = kind.features
    legal = not problems(op, s, hw)
    values: tuple[float, ...] = (*_op_part(op), *_hw_part(hw), s.threads, s.threads / hw.cores,
                                 float(legal), *_block_op_part(op))
    ours = type(s) is op_kind(op.kind).schedule
    if ours:
        try:
            cross = block.cross_values(op, s, hw)
        except (ZeroDivisionError, ValueError):
            # Illegal knobs (a zero block, a tile narrower than a vector) still get a row:
            # the model learns from their "legal" flag and their outcome.
            cross = (NAN,) * len(block.cross_names)
        values = (*values, *block.knob_values(s, hw), *cross)
    estimated = ours and legal
    if estimated:
        values = (*values, *_estimate_part(op, s, hw))
    out[:] = np.nan
    out[_SCATTER[(kind.name, ours, estimated)]] = values


def features(op: OpSignature, schedule: Schedule, hw: HardwareSpec) -> np.ndarray:
    """The feature vector (float32, ``len(FEATURE_NAMES)``) of one (op, schedule, hw)."""
    out = np.empty(len(FEATURE_NAMES), dtype=np.float32)
    _fill(out, op, schedule, hw)
    return out


def matrix(op: OpSignature, schedules: Sequence[Schedule], hw: HardwareSpec) -> np.ndarray:
    """Feature rows (``len(schedules) x len(FEATURE_NAMES)``, float32) of one op's candidates."""
    out = np.empty((len(schedules), len(FEATURE_NAMES)), dtype=np.float32)
    for i, s in enumerate(schedules):
        _fill(out[i], op, s, hw)
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
        _fill(table[j], ops[op_c[i]], schedules[s_c[i]], hws[hw_c[i]])
    X[rows] = table[inverse]
    return X, ok
