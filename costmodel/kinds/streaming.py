"""The roofline of streaming kernels (element-wise chains, pooling): each tensor crosses
memory once, and the vector instructions run at the issue rate, throttled when a step has
too few independent vectors in flight. Plain stores to an output beyond the last-level cache
also read it first (write-allocate); streaming stores do not."""

from __future__ import annotations

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.costmodel.analytic import Estimate, constants, stream_bytes_per_s


def streaming_estimate(op: OpSignature, hw: HardwareSpec, *, threads: int, work_items: int,
                       vector_ops: float, in_flight: int, out_bytes: float,
                       nontemporal: bool) -> Estimate:
    """``vector_ops`` instructions split over ``work_items`` parallel items (rows, planes),
    ``in_flight`` independent vectors per step; ``out_bytes`` written."""
    arch = constants(hw)
    busy = min(threads, max(1, work_items))
    eff = min(1.0, 0.4 + 0.3 * in_flight)
    compute_s = vector_ops / (arch.fma_pipes * arch.ghz * 1e9 * busy * eff)
    moved = float(op.min_bytes)
    in_cache = moved <= hw.l3_bytes / max(1, hw.l3_shared_by) * busy
    if not in_cache and not nontemporal:
        moved += out_bytes
    elif in_cache and nontemporal:
        moved += out_bytes  # streamed out to memory although it fitted the cache
    rate = (stream_bytes_per_s(hw, moved, busy) if in_cache
            else arch.stream_gbps_per_core * 1e9 * busy)
    memory_s = moved / rate
    overhead_s = arch.call_overhead_s + (arch.fork_join_s if threads > 1 else 0.0)
    seconds = max(compute_s, memory_s) + overhead_s
    return Estimate(seconds, op.flops / seconds / 1e9, compute_s, memory_s, overhead_s)
