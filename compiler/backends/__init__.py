"""The backend protocol: the one road from generated source to code running on a device.

A backend owns everything between "a validated (op, schedule) on a device" and "a callable,
timed kernel": the vocabulary its emitters write in and the flags that build it, the
toolchain that turns source into a cached artifact, the loader and its kernel handles
(calling, in-artifact timing, weights packed once, timing on rotated weight copies), the
native runner a compiled model's plan runs on (its loader does the per-process setup its
kernels need: the thread wait policy, later AMX's permission), the machine probes, and the
architecture constants the analytic estimates use. Generic code (codegen, runtime, the
measurement runner and worker, deploy, the native program) asks :func:`backend_for` /
:func:`backend_named` and holds only the protocol types below: no ctypes, compiler flags
or ISA names. docs/ARCHITECTURE.md ("Adding a backend") shows how a new one plugs in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tunecache.compiler.plugins import load_backends

if TYPE_CHECKING:
    import numpy as np

    from tunecache.compiler.codegen import KernelSource
    from tunecache.compiler.codegen.isa import IsaDialect
    from tunecache.compiler.hardware import HardwareSpec
    from tunecache.compiler.ops import OpSignature
    from tunecache.compiler.schedule import Schedule


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


@dataclass(frozen=True, slots=True)
class Artifact:
    """A built kernel on disk (a backend's own format) and how it was obtained."""

    path: Path
    key: str
    cached: bool
    compile_seconds: float
    sha256: str = ""


Timer = Callable[[int], float]
"""``run(n)`` -> seconds for ``n`` back-to-back calls."""


class BoundKernel(Protocol):
    """A kernel with its constant weights packed once; called without them."""

    @property
    def op(self) -> OpSignature: ...

    @property
    def packed(self) -> np.ndarray: ...

    @property
    def entry_address(self) -> int | None:
        """The in-process entry taking the kernel ABI's ``void **args`` (the packed weights
        in the weights' place), or None where the kernel does not run in this process."""

    def __call__(self, *inputs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray: ...

    def time(self, *inputs: np.ndarray, out: np.ndarray, iters: int) -> float: ...


class KernelHandle(Protocol):
    """A loaded kernel for one op signature: call it as ``kernel(A, B, ..., out=None)``.
    Every argument is checked (dtype, shape, layout) before the device sees it."""

    @property
    def op(self) -> OpSignature: ...

    @property
    def entry_address(self) -> int | None:
        """The in-process entry (``int tc_kernel(void **args)``) a native plan calls, or None
        where the kernel does not run in this process (an emulated or remote device)."""

    @property
    def prepacks_weights(self) -> bool:
        """Whether the kernel can take its weights (second input) packed once."""

    def __call__(self, *inputs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray: ...

    def time(self, *inputs: np.ndarray, out: np.ndarray, iters: int) -> float:
        """Seconds for ``iters`` back-to-back calls, timed inside the artifact."""

    def bind_weights(self, weights: np.ndarray) -> BoundKernel: ...

    def bind_packed(self, packed: np.ndarray) -> BoundKernel: ...

    def rotating_timer(self, inputs: tuple[np.ndarray, ...], out: np.ndarray, span_bytes: int,
                       bound: BoundKernel | None = None) -> tuple[Timer, int]:
        """A timer whose call ``i`` reads weight copy ``i mod copies``, the copies spanning
        ``span_bytes`` (weights met in memory, as a model whose weights outgrow the caches
        meets them); and the number of copies."""


class PlanRunner(Protocol):
    """Runs a compiled model's plan of native steps with no Python between them. Steps,
    references and tables are numpy arrays passed by address (see
    :mod:`tunecache.compiler.native.program`)."""

    max_args: int
    step_dtype: Any
    ref_dtype: Any

    @property
    def copy_entry(self) -> int:
        """The entry of a strided copy step (its parameters: ``native.copies``)."""

    def run(self, n: int, steps: int, refs: int, entries: int, bases: int) -> int:
        """Run ``n`` steps; 0, or 1 + the index of the step whose kernel failed."""

    def run_timed(self, n: int, steps: int, refs: int, entries: int, bases: int,
                  seconds: int) -> int:
        """:meth:`run`, adding each step's wall seconds to the doubles at ``seconds``."""


class Backend(Protocol):
    """A code-generation target. Implementations are stateless values."""

    @property
    def name(self) -> str:
        """A short name (``cpu``)."""

    def supports(self, hw: HardwareSpec) -> bool:
        """Whether this backend generates code for devices like ``hw``."""

    def dialect(self, hw: HardwareSpec) -> IsaDialect:
        """The vocabulary (vector type, intrinsics, flags) kind emitters write in for ``hw``."""

    def build_flags(self, hw: HardwareSpec, schedule: Schedule) -> tuple[str, ...]:
        """The flags a kernel with ``schedule`` is built with on ``hw``."""

    def ensure_runnable(self, hw: HardwareSpec) -> None:
        """HardwareError unless this machine can run kernels built for ``hw`` (natively, or
        on an emulator the backend drives): never a SIGILL later."""

    def ensure_measurable(self, hw: HardwareSpec) -> None:
        """HardwareError unless kernels for ``hw`` can be timed here: on such a machine, not
        on an emulator, whose seconds say nothing of it (a measurement is recorded)."""

    def toolchain(self) -> str:
        """The identity of the toolchain kernels are built with (it is part of every
        measurement record); BuildError where there is none."""

    def build(self, source: KernelSource) -> Artifact:
        """Source -> artifact on disk, through a content-addressed cache."""

    def load(self, op: OpSignature, artifact: Path) -> KernelHandle:
        """A callable, timed kernel for ``op`` from a built artifact, verified first."""

    def runtime_artifacts(self) -> tuple[Artifact, ...]:
        """The artifacts besides kernels that a compiled model's plan runs on (the plan
        runner), built now: what a compiled model's package carries with its kernels."""

    def install_artifact(self, key: str, data: bytes) -> Artifact:
        """Put an artifact built elsewhere (a package's, its digest already checked) into
        the cache under ``key``, recorded like a build; loads then verify it as any."""

    def adopt_toolchain(self, identity: str) -> None:
        """Where this machine has no toolchain, look artifacts up as built by ``identity``
        (a package's): a machine with no compiler then runs what a package installed."""

    def worker_environment(self) -> dict[str, str]:
        """Environment a process that times this backend's kernels starts with."""

    def prepare_measurement(self) -> None:
        """Whatever measurement workers load besides kernels, built before they start."""

    def plan_runner(self) -> PlanRunner:
        """The native runner a compiled model's plan runs on."""

    def constants(self, hw: HardwareSpec) -> ArchConstants:
        """The architecture constants the analytic estimates use on ``hw``."""

    def peak_gflops(self, hw: HardwareSpec, threads: int = 1) -> float:
        """Measured float32 FMA throughput of ``threads`` threads."""

    def bandwidth_gbs(self, hw: HardwareSpec, threads: int = 1) -> float:
        """Measured memory bandwidth (a STREAM copy, bytes read + written)."""


_BACKENDS: list[Backend] = []


def register_backend(backend: Backend) -> Backend:
    """Add a backend; later registrations are asked first (a plug-in may override)."""
    _BACKENDS.insert(0, backend)
    return backend


def registered_backends() -> list[Backend]:
    """Every registered backend (:func:`tunecache.compiler.plugins.load_backends` first)."""
    load_backends()
    return _BACKENDS


def backend_for(hw: HardwareSpec) -> Backend:
    """The backend that serves ``hw`` (ValueError naming the known backends if none)."""
    for backend in registered_backends():
        if backend.supports(hw):
            return backend
    names = ", ".join(b.name for b in _BACKENDS)
    raise ValueError(f"no backend generates code for {hw.arch}/{hw.isa}; backends: {names}")


def backend_named(name: str) -> Backend:
    """The registered backend called ``name`` (ValueError naming the known ones if none)."""
    for backend in registered_backends():
        if backend.name == name:
            return backend
    names = ", ".join(b.name for b in _BACKENDS)
    raise ValueError(f"no backend named {name!r}; backends: {names}")


def host_backend() -> Backend:
    """The backend of the machine this process runs on (its detected or pinned spec)."""
    from tunecache.compiler.hardware import local_spec

    return backend_for(local_spec())
