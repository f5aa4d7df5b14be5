"""The cost model's side of ``lrn``: the streaming roofline and features.

X is read once from memory and Y written once; the window's other channels are re-read
from L1 (``nchw``: the tile's rows of the window's planes; blocked: the staged lines).
Vector instructions per output vector: a load and a multiply-add (or add) per window
channel; 4 for the affine step and the loads and stores of x and y; 12 per 8 lanes for the
power's two square roots and division, whose throughput is per lane (measured on an AMD
EPYC, one thread, AlexNet's first LRN: 11 cycles per AVX2 vector, 22 per AVX-512 vector,
12 per 4-lane generic vector, whose square roots are scalar); for a blocked layout 3 more to
stage the square. Vectors per step did not change the time there (each vector's power is
independent of the next), so every ``vec`` counts as enough in flight. Penalties: a blocked
tile of one or two pixels stalls on store forwarding between staging and the window sums
(measured 1.3x and 1.1x the time of four); an ``nchw`` tile whose window rows overflow L1
re-reads them from L2, and the smallest tiles pay their per-channel loop more often; tiles
that do not split evenly over the threads leave some idle."""

from __future__ import annotations

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.layouts import channel_block
from tunecache.compiler.kinds.lrn import PLAIN_PIXELS, LrnSchedule, is_blocked
from tunecache.compiler.ops import OpSignature
from tunecache.costmodel.analytic import Estimate, ceil_div, round_up
from tunecache.costmodel.kinds import CostKind, FeatureBlock, l2, register
from tunecache.costmodel.kinds.streaming import streaming_estimate

POWER_FIXED_OPS = 4.0
ROOT_OPS_PER_8_LANES = 12.0
STAGE_OPS = 3.0
STAGED_PIXELS_PENALTY = {1: 1.3, 2: 1.1}
SMALL_TILE_PENALTY = 1.1
L2_TILE_PENALTY = 1.15


def _tiles(op: OpSignature, s: LrnSchedule) -> int:
    """The parallel work items: tiles of ``pixels`` pixels per image."""
    return op.dim("N") * ceil_div(op.dim("H") * op.dim("W"), s.pixels)


def _channels(op: OpSignature) -> int:
    """Channels as stored: padded to whole blocks in a blocked layout."""
    x = channel_block(op.attr("layout"))
    return round_up(op.dim("C"), x) if x else op.dim("C")


def _tile_bytes(op: OpSignature, s: LrnSchedule) -> float:
    """What a tile keeps in L1: the window's rows of the tile, or its staged lines."""
    size = op.dim("size")
    if is_blocked(op):
        return 4.0 * s.pixels * (_channels(op) + size)
    return 4.0 * s.pixels * size


def estimate(op: OpSignature, s: LrnSchedule, hw: HardwareSpec) -> Estimate:
    d = op.dims_dict
    elements = d["N"] * _channels(op) * d["H"] * d["W"]
    vectors = ceil_div(elements, hw.lanes)
    per_vector = 1.5 * d["size"] + POWER_FIXED_OPS \
        + ROOT_OPS_PER_8_LANES * max(1.0, hw.lanes / 8)
    if is_blocked(op):
        per_vector += STAGE_OPS
        penalty = STAGED_PIXELS_PENALTY.get(s.pixels, 1.0)
    else:
        penalty = SMALL_TILE_PENALTY if s.pixels == PLAIN_PIXELS[0] else 1.0
        if _tile_bytes(op, s) > 0.75 * hw.l1d_bytes:
            penalty *= L2_TILE_PENALTY
    tiles = _tiles(op, s)
    busy = min(s.threads, tiles)
    imbalance = ceil_div(tiles, busy) * busy / tiles
    return streaming_estimate(op, hw, threads=s.threads, work_items=tiles,
                              vector_ops=vectors * per_vector * penalty * imbalance,
                              in_flight=2, out_bytes=4.0 * elements, nontemporal=False)


def _op_values(op: OpSignature) -> tuple[float, ...]:
    d = op.dims_dict
    x = channel_block(op.attr("layout"))
    return (l2(d["N"]), l2(d["C"]), l2(d["H"]), l2(d["W"]), x, x, d["size"])


def _knob_values(s: LrnSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    return (s.vec, l2(s.pixels))


def _cross_values(op: OpSignature, s: LrnSchedule, hw: HardwareSpec) -> tuple[float, ...]:
    tiles = _tiles(op, s)
    busiest = ceil_div(tiles, s.threads)
    return (tiles / (busiest * s.threads), l2(tiles / s.threads),
            _tile_bytes(op, s) / hw.l1d_bytes)


FEATURES = FeatureBlock(
    op_names=("log_conv_n", "log_conv_c", "log_conv_h", "log_conv_w", "layout_in_block",
              "layout_out_block", "lrn_size"),
    op_values=_op_values,
    knob_names=("vec_per_step", "log_pixels_per_tile"),
    knob_values=_knob_values,
    cross_names=("parallel_balance", "log_parallel_units", "fp_l1"),
    cross_values=_cross_values,
)

KIND = register(CostKind(name="lrn", estimate=estimate, features=FEATURES))
