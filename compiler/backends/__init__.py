"""The backend protocol: what a target (the CPU today; NEON or CUDA later) implements.

A backend owns everything between "a validated (op, schedule) on a device" and "a callable,
timed kernel": the device spec it detects, the vocabulary its emitters write in, the
toolchain that turns source into a cached artifact, the loader, and the architecture
constants the analytic estimates use. Generic code (codegen, runtime, the tiler's estimates)
asks :func:`backend_for` instead of assuming gcc, ``.so`` files, ctypes or x86 numbers.
docs/ARCHITECTURE.md ("Adding a backend") shows how a new one plugs in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    from tunecache.compiler.codegen import KernelSource
    from tunecache.compiler.codegen.isa import IsaDialect
    from tunecache.compiler.hardware import HardwareSpec
    from tunecache.compiler.ops import OpSignature
    from tunecache.compiler.runtime import Kernel


@dataclass(frozen=True)
class ArchConstants:
    """Per-core machine numbers the roofline estimates use (declared, or measured by a
    calibration). Only ratios between schedules matter for ranking; the absolute scale makes
    estimates readable in milliseconds. ``dram_gbps_per_core`` is what a blocked GEMM or
    convolution sustains from memory; ``stream_gbps_per_core`` what a streaming kernel (one
    vector load and store per element) does (a STREAM copy: about 33 GB/s on one core of the
    project's Zen 3 and Zen 4 VMs). ``fma_in_flight`` is how many independent FMAs of the
    ISA's vector width keep the FMA units busy: pipes x latency (2 x 4), fewer where one
    wide FMA occupies several pipes. ``broadcast_loads`` is what one broadcast operand of a
    micro-kernel costs in vector loads: about half where the ISA folds it into the FMA as a
    memory operand (AVX-512's embedded broadcast), more where it is an instruction and a
    register of its own (AVX2). ``window_uops`` is how many micro-ops the core's out-of-order
    window holds beyond the one executing (Zen 3's reorder buffer has 256 entries, Zen 4's
    320): a micro-kernel whose whole reduction is shorter than that overlaps the next tile's
    independent accumulator chains with its own. ``weight_stream_exposed`` is the share of
    the time a matmul takes to stream its constant weights from memory that its compute
    does not hide: none where bandwidth is ample for the FMA rate, all where it is not (the
    two-FMA-unit Xeon, :mod:`tunecache.compiler.backends.cpu`)."""

    ghz: float = 3.0
    fma_pipes: int = 2
    fma_in_flight: int = 8
    broadcast_loads: float = 0.5
    window_uops: int = 224
    bytes_per_cycle: Mapping[str, float] = field(
        default_factory=lambda: {"l1": 64.0, "l2": 32.0, "l3": 16.0})
    dram_gbps_per_core: float = 10.0
    stream_gbps_per_core: float = 30.0
    pack_gbps: float = 12.0
    call_overhead_s: float = 1.5e-6
    fork_join_s: float = 8e-6
    barrier_s: float = 1.5e-6
    block_overhead_s: float = 1e-7
    merge_s_per_element: float = 1e-9
    weight_stream_exposed: float = 0.0


class Backend(Protocol):
    """A code-generation target. Implementations are stateless values."""

    @property
    def name(self) -> str:
        """A short name (``cpu``)."""

    def supports(self, hw: HardwareSpec) -> bool:
        """Whether this backend generates code for devices like ``hw``."""

    def dialect(self, hw: HardwareSpec) -> IsaDialect:
        """The vocabulary (vector type, intrinsics, flags) kind emitters write in for ``hw``."""

    def build(self, source: KernelSource) -> Path:
        """Source -> artifact on disk, through a content-addressed cache."""

    def load(self, op: OpSignature, artifact: Path) -> Kernel:
        """A callable, timed kernel for ``op`` from a built artifact."""

    def constants(self, hw: HardwareSpec) -> ArchConstants:
        """The architecture constants the analytic estimates use on ``hw``."""


_BACKENDS: list[Backend] = []


def register_backend(backend: Backend) -> Backend:
    """Add a backend; later registrations are asked first (a plug-in may override)."""
    _BACKENDS.insert(0, backend)
    return backend


def backend_for(hw: HardwareSpec) -> Backend:
    """The backend that serves ``hw`` (ValueError naming the known backends if none)."""
    if not _BACKENDS:
        from tunecache.compiler.backends import cpu  # noqa: F401  (registers itself)
    for backend in _BACKENDS:
        if backend.supports(hw):
            return backend
    names = ", ".join(b.name for b in _BACKENDS)
    raise ValueError(f"no backend generates code for {hw.arch}/{hw.isa}; backends: {names}")
