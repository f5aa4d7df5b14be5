"""The cost model's side of ``attention``: a roofline over the fused kernel's parts, and its
feature block.

Per batch item the kernel computes, for every query block, the scores of the keys up to the
block's last visible one (``Q K^T``: a register tile of ``q_block`` rows, vectorised over keys
for ``score=outer`` or over ``D`` with a horizontal sum per score for ``score=dot``), an
online softmax over them (about 30 vector instructions per vector of scores: mask, max, the
exp polynomial, sum, stores; plus a fixed cost per row and key block) and ``P V`` (a register
tile of ``q_block`` rows; on matrix tiles, ``score=tiles``, products of 16 rows by 32 pairs by
16 columns). ``score=outer`` also transposes K once per batch item a thread
visits (scalar moves). Memory: Q, K, V and Y stream once; each query block re-reads the
keys and values it sees from the closest cache level they fit in.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.attention import (
    AttentionSchedule,
    balanced_chunks,
    dot_keys,
    has_mask_input,
    is_causal,
    tile_vectors,
    value_dim,
)
from tunecache.compiler.ops import OpSignature
from tunecache.costmodel.analytic import (
    Estimate,
    ceil_div,
    constants,
    micro_efficiency,
    stream_bytes_per_s,
)
from tunecache.costmodel.kinds import CostKind, FeatureBlock, l2, register

SOFTMAX_OPS_PER_VECTOR = 30.0
ROW_BLOCK_OPS = 80.0  # per row and key block: horizontal max and sum, the rescale's exp, calls
HSUM_OPS = 6.0
PACK_CYCLES_PER_FLOAT = 1.0
TILE_PRODUCT_CYCLES = 16.0


@dataclass(frozen=True)
class Geometry:
    """How one schedule walks one batch item of the op: query blocks, the key-rows whose
    scores it computes (``key_rows``: sum over query rows of the keys their block reads),
    key blocks per query block, and the register tiles' shapes."""

    query_blocks: int
    key_rows: float
    visible: float
    key_blocks: float
    score_rows: int
    score_vectors: int
    pv_vectors: int


def geometry(op: OpSignature, s: AttentionSchedule, hw: HardwareSpec) -> Geometry:
    """The :class:`Geometry` of ``s`` on ``op`` (closed forms: no loop over query blocks)."""
    m, n = op.dim("M"), op.dim("N")
    q = max(1, min(s.q_block, m))
    full, rem = divmod(m, q)
    blocks = full + (rem > 0)
    if is_causal(op):
        shift = n - m
        # block i (of q rows) reads keys up to (i + 1) q + shift; the remainder block all N
        ends = full * shift + q * full * (full + 1) / 2
        key_rows = q * ends + rem * n
        ends_all = ends + (n if rem else 0)
        visible = m * n - m * (m - 1) / 2
    else:
        key_rows = float(m * n)
        ends_all = float(blocks * n)
        visible = float(m * n)
    registers = hw.vector_registers
    pv = balanced_chunks(value_dim(op) // hw.lanes, tile_vectors(q, registers))
    return Geometry(
        query_blocks=blocks, key_rows=key_rows, visible=visible,
        key_blocks=ends_all / max(1, s.k_block) + 0.5 * blocks,
        score_rows=q,
        score_vectors=tile_vectors(q, registers) if s.score == "outer" else dot_keys(q, registers),
        pv_vectors=max(pv) if pv else 1,
    )


def _item_cycles(op: OpSignature, s: AttentionSchedule, hw: HardwareSpec, g: Geometry) -> float:
    """Cycles for one batch item (all its query blocks), packing excluded."""
    arch = constants(hw)
    lanes, pipes = hw.lanes, arch.fma_pipes
    d_vecs = ceil_div(op.dim("D"), lanes)
    dv_vecs = ceil_div(value_dim(op), lanes)
    q = g.score_rows
    if s.score == "tiles":
        # a tile product of 16 rows x 32 pairs x 16 columns: TILE_PRODUCT_CYCLES
        per_key_row = (ceil_div(op.dim("D"), 32) + ceil_div(value_dim(op), 16) / 2) / 16
        softmax = (g.key_rows / lanes * SOFTMAX_OPS_PER_VECTOR + q * g.query_blocks
                   * ROW_BLOCK_OPS) / pipes
        return g.key_rows * per_key_row * TILE_PRODUCT_CYCLES / 16 + softmax
    if s.score == "outer":
        score = g.key_rows * d_vecs / (pipes * micro_efficiency(q, g.score_vectors, arch))
    else:
        # accumulators q x keys, one load per row and key per step; then a horizontal sum
        eff = min(1.0, q * g.score_vectors / arch.fma_in_flight) * 0.9
        score = g.key_rows * (d_vecs / (pipes * eff) + HSUM_OPS / pipes)
    pv = g.key_rows * dv_vecs / (pipes * micro_efficiency(q, g.pv_vectors, arch))
    softmax = (g.key_rows / lanes * SOFTMAX_OPS_PER_VECTOR
               + g.key_blocks * q * ROW_BLOCK_OPS) / pipes
    return score + pv + softmax


def estimate(op: OpSignature, s: AttentionSchedule, hw: HardwareSpec) -> Estimate:
    """Roofline-style time estimate for one attention schedule."""
    arch = constants(hw)
    g = geometry(op, s, hw)
    b, n = op.dim("B"), op.dim("N")
    items = b * g.query_blocks
    busy = max(1, min(s.threads, items))
    per_thread = ceil_div(items, busy)
    cycles = _item_cycles(op, s, hw, g) * per_thread / g.query_blocks
    if s.score != "dot":  # K^T packed per item (and V, on tiles)
        items_visited = min(per_thread, ceil_div(per_thread, g.query_blocks) + 1)
        packed = op.dim("D") + (value_dim(op) if s.score == "tiles" else 0)
        cycles += items_visited * packed * n * PACK_CYCLES_PER_FLOAT
    compute_s = cycles / (arch.ghz * 1e9)
    kv_bytes = 4.0 * n * (op.dim("D") + value_dim(op))
    level = ("l1" if kv_bytes <= 0.5 * hw.l1d_bytes else
             "l2" if kv_bytes <= 0.5 * hw.l2_bytes else "l3")
    rereads = 4.0 * b * g.key_rows / g.score_rows * (op.dim("D") + value_dim(op))
    # Re-reads add to the compute time rather than overlap it: the register tiles wait on
    # them (measured: 2-row query blocks of BERT-base, whose K^T and V come from L2 once
    # per block, take 1.7x the time of 6-row ones).
    reread_s = rereads / (arch.bytes_per_cycle[level] * arch.ghz * 1e9 * busy)
    stream_s = op.min_bytes / stream_bytes_per_s(hw, op.min_bytes, busy)
    memory_s = stream_s + reread_s
    overhead_s = arch.call_overhead_s + (arch.fork_join_s if s.threads > 1 else 0.0)
    seconds = max(compute_s, stream_s) + reread_s + overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, memory_s, overhead_s)


def _op_values(op: OpSignature) -> tuple[float, ...]:
    # attn_padding flags any additive mask input (padding, causal_padding, full): the kernel
    # adds a mask row per score row either way.
    return (l2(op.dim("B")), l2(op.dim("M")), l2(op.dim("N")), l2(op.dim("D")),
            l2(value_dim(op)), float(is_causal(op)), float(has_mask_input(op)))


def _knob_values(s: AttentionSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    return (s.q_block, s.k_block, l2(s.k_block), float(s.score == "dot"))


def _cross_values(op: OpSignature, s: AttentionSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    g = geometry(op, s, hw)
    m, n = op.dim("M"), op.dim("N")
    items = op.dim("B") * g.query_blocks
    busiest = ceil_div(items, s.threads)
    block_floats = s.q_block * (op.dim("D") + s.k_block + value_dim(op))
    kv_bytes = 4.0 * n * (op.dim("D") + value_dim(op))
    return (
        g.score_rows, g.score_vectors, g.score_rows * g.score_vectors,
        m / (g.query_blocks * s.q_block),
        n / (ceil_div(n, s.k_block) * s.k_block),
        4.0 * block_floats / hw.l1d_bytes,
        kv_bytes / hw.l2_bytes,
        g.visible / (m * n),
        items / (busiest * s.threads),
        l2(items / s.threads),
    )


FEATURES = FeatureBlock(
    op_names=("log_attn_b", "log_attn_m", "log_attn_n", "log_attn_d", "log_attn_dv",
              "attn_causal", "attn_padding"),
    op_values=_op_values,
    knob_names=("q_block", "k_block", "log_k_block", "score_dot"),
    knob_values=_knob_values,
    cross_names=("tile_rows", "tile_vectors", "accumulators", "edge_eff_m", "edge_eff_n",
                 "fp_l1", "attn_kv_l2", "attn_visible", "parallel_balance",
                 "log_parallel_units"),
    cross_values=_cross_values,
)

KIND = register(CostKind(name="attention", estimate=estimate, features=FEATURES))
