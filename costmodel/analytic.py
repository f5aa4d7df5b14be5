"""The analytic performance model: a roofline-style time estimate for (op, schedule, hardware).

The tiler ranks its candidates with it, and the learned cost model uses it (and its parts) as
features. Machine numbers are nominal per core (the spec has no clock or bandwidth): only
ratios between schedules matter for ranking; the absolute scale makes the estimate readable
in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunecache.compiler.backends import ArchConstants, backend_for
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.mathutil import ceil_div as ceil_div
from tunecache.compiler.mathutil import round_up as round_up
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule

# ceil_div and round_up (compiler.mathutil's) are re-exported: the kinds' estimates and the
# tuner's kinds import them from here.

# The machine numbers (FMA pipes and latency, bytes per cycle per level, DRAM and packing
# bandwidth, call / fork-join / barrier overheads) belong to the backend that serves the
# hardware: ``backend_for(hw).constants(hw)``.


DEFAULT_CONSTANTS = ArchConstants()


def constants(hw: HardwareSpec) -> ArchConstants:
    """The architecture constants the estimates use on ``hw`` (its backend's)."""
    return backend_for(hw).constants(hw)


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


def peak_gflops_per_core(hw: HardwareSpec) -> float:
    c = constants(hw)
    return hw.lanes * 2 * c.fma_pipes * c.ghz


# Independent accumulators a micro-kernel needs per FMA in flight (pipes x latency) before
# its loads and broadcasts stop costing FMA slots. Measured on the AVX2 Zen 3 VM, one thread,
# B packed: matmul(M=128,N=3072,K=768) ran 63-78 GFLOP/s with 4x24 tiles (12 accumulators),
# 54-73 with 6x16, 41-67 with 8x8 and 46-64 with 2x32 (8 accumulators, which a margin of 1
# rated as good as 12); the attention kernel's 6-row tiles beat its 8-row ones. conv2d's
# direct tiles pass 1: there 8 and 14 accumulators measured within 10% on NCHW input.
LATENCY_MARGIN = 1.5


def micro_efficiency(mr: int, nv: int, c: ArchConstants = DEFAULT_CONSTANTS,
                     margin: float = LATENCY_MARGIN, steps: int | None = None) -> float:
    """Fraction of FMA peak a ``mr x (nv vectors)`` micro-kernel can sustain: the lower of
    what FMA latency and what loads allow (a latency-bound kernel leaves load slots idle,
    so the two limits do not compound).

    Latency: fewer than fma_in_flight * LATENCY_MARGIN independent accumulators leave pipes
    idle, unless the tile's reduction is only ``steps`` long: then the out-of-order window
    (``c.window_uops``) also holds the next tiles' chains.
    Loads: per k step the kernel loads nv vectors and broadcasts mr scalars for mr*nv FMAs;
    with two load ports a ratio below one FMA per load starves the FMA pipes. A broadcast
    costs ``c.broadcast_loads`` vector loads: half at AVX-512, which folds it into the FMA as
    a memory operand (tall one-vector tiles such as 22x16 are among the fastest there), more
    at AVX2, where one-vector tiles (a broadcast per FMA) are the slow ones.

    Measured on the AVX2 Zen 3 VM (ARCHITECTURE change 57): a 4-accumulator direct tile ran
    MobileNet-v2's 3x3 stem (27 reduction steps) at 40 GFLOP/s per core, where the product
    of both limits and no overlap predicted 8, and it ran ResNet-50's 7x7 stem (147 steps)
    at 45% of peak, the latency limit alone.
    """
    acc = mr * nv
    in_flight = float(acc)
    if steps is not None:
        in_flight *= 1.0 + c.window_uops / max(1, steps * (acc + nv + mr))
    latency = min(1.0, in_flight / (c.fma_in_flight * margin))
    loads = min(1.0, acc / (c.broadcast_loads * mr + nv))
    return 0.92 * min(latency, loads)


def estimate(op: OpSignature, s: Schedule, hw: HardwareSpec) -> Estimate:
    """Roofline-style time estimate for one schedule of ``op`` on ``hw`` (its kind's)."""
    from tunecache.costmodel.kinds import cost_kind

    return cost_kind(op.kind).estimate(op, s, hw)


def stream_bytes_per_s(hw: HardwareSpec, footprint: float, threads: int) -> float:
    """Bandwidth a streaming kernel gets for a working set of ``footprint`` bytes on
    ``threads`` cores: this core's share of L3 when it fits there, DRAM otherwise."""
    c = constants(hw)
    l3_share = hw.l3_bytes / max(1, hw.l3_shared_by)
    if footprint <= l3_share * threads:
        return c.bytes_per_cycle["l3"] * c.ghz * 1e9 * threads
    return c.dram_gbps_per_core * 1e9 * threads


