"""The runner: build and time candidate kernels safely, every outcome a value.

:class:`Runner` takes a batch of candidates (op + schedule), validates and generates them,
compiles them in parallel through the artifact cache, then checks and times each one in an
isolated worker process (:mod:`tunecache.tuner.measure.worker`). A kernel that crashes or hangs
kills only the worker; the runner records the outcome and starts a fresh worker for the rest.

Outcomes (``MeasureResult.status``): ``ok``, ``invalid`` (schedule rejected before codegen),
``compile_error``, ``runtime_error`` (crash or exception), ``wrong_result`` (differs from the
float64 numpy reference), ``timeout``.

Timing protocol: one call checked against the reference, one untimed warm-up, then repeats of
``number`` back-to-back calls (timed inside the shared object) until ``min_repeats`` repeats
and ``min_time_s`` in total; every repeat's per-call time is kept, median and min reported.
On a shared machine a neighbour's burst slows some repeats: when the median exceeds the
fastest repeat by more than ``noise_tolerance``, the timing is repeated (without the check)
up to ``noise_retries`` times and the attempt with the lowest median is kept. Conv2d kernels
are timed with their weights packed once (``tc_kernel_packed``), as compiled models run them.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from tunecache.compiler.backends import Artifact, Backend, backend_for
from tunecache.compiler.codegen import CODEGEN_VERSION, KernelSource, generate
from tunecache.compiler.errors import BuildError, ScheduleError, TunecacheError
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule

STATUSES = ("ok", "invalid", "compile_error", "runtime_error", "wrong_result", "timeout")


@dataclass(frozen=True, slots=True)
class TimingConfig:
    """How long and how often to time each kernel, and when to give up on it.

    ``prepacked_weights``: whether kernels that can take their weights packed once
    (``Kernel.bind_weights``) are timed that way. ``None`` (the default) follows the op kind
    (``OpKind.prepacked_timing``: conv2d, pwdw and matmul, whose weights compiled models hold
    constant and pack once); True / False force it either way (False: weights that are an
    activation, packed on every call).
    """

    min_time_s: float = 0.2
    min_repeats: int = 5
    max_repeats: int = 100
    repeat_s: float = 0.01
    timeout_s: float = 60.0
    check: bool = True
    seed: int = 0
    noise_tolerance: float = 0.10
    noise_retries: int = 2
    prepacked_weights: bool | None = None
    cold_weights: bool = True
    """Time kernels with pre-packed weights on copies of them rotated past twice the L3
    (``compiler.runtime.rotating_timer``), as a model whose weights outgrow the caches
    runs them: a decode step's M=8 matmuls ranked on warm weights picked splits by rows that
    ran 1.4x slower in the model. False: the weights stay warm between calls."""

    def request(self) -> dict[str, Any]:
        return {
            "min_time_s": self.min_time_s,
            "min_repeats": self.min_repeats,
            "max_repeats": self.max_repeats,
            "repeat_s": self.repeat_s,
        }


@dataclass(frozen=True, slots=True)
class Candidate:
    """A schedule to measure for an op, and where it came from."""

    op: OpSignature
    schedule: Schedule
    source: str = "manual"
    predicted: float | None = None


@dataclass(frozen=True, slots=True)
class MeasureResult:
    """The outcome of measuring one candidate (failures included)."""

    op: OpSignature
    schedule: Schedule | None
    status: str
    error: str | None = None
    runtimes_s: tuple[float, ...] = ()
    compile_s: float | None = None
    source_hash: str | None = None
    flags: str | None = None
    compiler: str | None = None
    codegen_version: str = CODEGEN_VERSION
    source: str = "manual"
    predicted: float | None = None
    cached_build: bool = False

    @property
    def median_s(self) -> float | None:
        return float(np.median(self.runtimes_s)) if self.runtimes_s else None

    @property
    def min_s(self) -> float | None:
        return min(self.runtimes_s) if self.runtimes_s else None

    @property
    def gflops(self) -> float | None:
        median = self.median_s
        return self.op.flops / median / 1e9 if median else None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly view (op and schedule as text)."""
        data = asdict(self)
        data.update(
            op=self.op.text,
            schedule=self.schedule.to_dict() if self.schedule else None,
            median_s=self.median_s,
            min_s=self.min_s,
            gflops=self.gflops,
            runtimes_s=list(self.runtimes_s),
        )
        return data


@dataclass
class _Job:
    """One kernel waiting to run, plus what is known about it so far."""

    index: int
    kernel: KernelSource
    artifact: Artifact
    request: dict[str, Any] = field(default_factory=dict)


class WorkerCrashed(Exception):
    """The worker process died while running a request."""


class WorkerProcess:
    """A measurement worker subprocess speaking JSON lines."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        """Start ``python -m tunecache.tuner.measure.worker`` with ``env`` added to ours."""
        child_env = dict(os.environ)
        child_env.update(env or {})
        child_env = {k: v for k, v in child_env.items() if v is not None}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tunecache.tuner.measure.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env,
            text=True,
            bufsize=1,
        )
        self._selector = selectors.DefaultSelector()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._stderr_fd = self.proc.stderr.fileno()
        os.set_blocking(self._stderr_fd, False)
        self._selector.register(self.proc.stdout, selectors.EVENT_READ, "out")
        self._selector.register(self._stderr_fd, selectors.EVENT_READ, "err")
        self._stderr_tail = ""
        ready = self._read(deadline=time.monotonic() + 60.0)
        if ready is None or ready.get("event") != "ready":
            self.kill()
            raise WorkerCrashed(f"measurement worker failed to start: {self.stderr_tail()}")

    def _read(self, deadline: float) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            events = self._selector.select(timeout=remaining)
            if any(key.data == "err" for key, _ in events):
                self._drain_stderr()
            if not any(key.data == "out" for key, _ in events):
                continue
            line = self.proc.stdout.readline()
            if not line:
                raise WorkerCrashed(self._death_message())
            return dict(json.loads(line))

    def _drain_stderr(self) -> None:
        if self._stderr_fd < 0:
            return
        try:
            while chunk := os.read(self._stderr_fd, 65536):
                self._stderr_tail = (self._stderr_tail + chunk.decode(errors="replace"))[-2000:]
        except (BlockingIOError, OSError, ValueError):
            return
        # End of file: the worker closed stderr (it is exiting); stop watching it.
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self._stderr_fd)
        self._stderr_fd = -1

    def request(self, req: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """Send ``req``; its answer, or None on timeout (the worker is then killed)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise WorkerCrashed(self._death_message()) from None
        deadline = time.monotonic() + timeout_s
        while True:
            message = self._read(deadline)
            if message is None:
                self.kill()
                return None
            if message.get("event") == "done" and message.get("id") == req["id"]:
                return message

    def stderr_tail(self) -> str:
        self._drain_stderr()
        return self._stderr_tail.strip()

    def _death_message(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        if code is not None and code < 0:
            try:
                reason = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                reason = f"killed by signal {-code}"
        else:
            reason = f"exited with status {code}"
        tail = self.stderr_tail()
        return f"worker {reason}" + (f": {tail[-500:]}" if tail else "")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._selector.close()

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


Progress = Callable[[MeasureResult], None]

# Environment per worker role. The kernel worker computes float64 references with a
# single-threaded BLAS (no spinning BLAS threads beside timed kernels), plus what the backend
# asks of a process that times its kernels; the numpy worker gets its thread count from
# threadpoolctl per request.
def _role_env(role: str, backend: Backend) -> dict[str, str]:
    if role == "numpy":
        return {}
    return {"OPENBLAS_NUM_THREADS": "1", **backend.worker_environment()}


class Runner:
    """Measures candidates on ``hw`` (which must describe this machine).

    Use as a context manager so the worker process is closed::

        with Runner(hw) as runner:
            results = runner.measure([Candidate(op, schedule)])
    """

    def __init__(
        self,
        hw: HardwareSpec,
        timing: TimingConfig | None = None,
        *,
        build_workers: int | None = None,
        toolchain: str | None = None,
    ) -> None:
        self.hw = hw
        self.backend = backend_for(hw)
        self.timing = timing or TimingConfig()
        self.build_workers = build_workers or max(1, os.cpu_count() or 1)
        self._toolchain = toolchain
        self._workers: dict[str, WorkerProcess] = {}
        self._next_id = 0

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()

    @property
    def toolchain(self) -> str:
        """The identity of the toolchain the backend builds kernels with (BuildError if
        there is none)."""
        if self._toolchain is None:
            self._toolchain = self.backend.toolchain()
        return self._toolchain

    def _worker_process(self, role: str = "kernel") -> WorkerProcess:
        """The live worker for ``role``, started if needed.

        Kernels and the numpy baseline run in separate processes: OpenMP and OpenBLAS thread
        pools in one process spin on and steal each other's cores, and OpenMP's binding of
        the main thread would pin every later BLAS thread to one core.
        """
        worker = self._workers.get(role)
        if worker is None or not worker.alive():
            if worker is not None:
                worker.kill()
            worker = WorkerProcess(_role_env(role, self.backend))
            self._workers[role] = worker
        return worker

    def _forget(self, role: str) -> None:
        worker = self._workers.pop(role, None)
        if worker is not None:
            worker.kill()

    @property
    def worker_pid(self) -> int | None:
        """PID of the kernel worker process (None before the first measurement)."""
        worker = self._workers.get("kernel")
        return worker.proc.pid if worker is not None else None

    def measure(self, candidates: Sequence[Candidate],
                progress: Progress | None = None) -> list[MeasureResult]:
        """Validate, generate, build and time every candidate; results in input order."""
        results, kernels = self._generate(candidates)
        if progress:
            for result in results:
                if result is not None:
                    progress(result)
        measured = self.measure_kernels(
            [k for _, k, _ in kernels],
            sources=[(c.source, c.predicted) for _, _, c in kernels],
            progress=progress,
        )
        return _merged(results, [i for i, _, _ in kernels], measured)

    def _generate(self, candidates: Sequence[Candidate]) -> tuple[
            list[MeasureResult | None], list[tuple[int, KernelSource, Candidate]]]:
        """Each candidate's kernel source (with its index), and an ``invalid`` result in
        its place where its schedule is rejected."""
        results: list[MeasureResult | None] = [None] * len(candidates)
        kernels: list[tuple[int, KernelSource, Candidate]] = []
        for i, cand in enumerate(candidates):
            try:
                kernels.append((i, generate(cand.op, cand.schedule, self.hw), cand))
            except ScheduleError as exc:
                results[i] = MeasureResult(cand.op, cand.schedule, "invalid", str(exc),
                                           source=cand.source, predicted=cand.predicted)
        return results, kernels

    def _build(self, kernels: Sequence[KernelSource],
               origin: Sequence[tuple[str, float | None]]) -> tuple[
            list[MeasureResult | None], list[tuple[int, Artifact]]]:
        """Build ``kernels`` in parallel: each built one's artifact (with its index), and a
        ``compile_error`` result in the place of each that failed."""
        self.backend.ensure_measurable(self.hw)
        if self.timing.cold_weights:
            # Built here, once, not inside a worker's first timed request (its timeout).
            self.backend.prepare_measurement()
        toolchain = self.toolchain

        def compile_one(k: KernelSource) -> Artifact | BuildError:
            try:
                return self.backend.build(k)
            except BuildError as exc:
                return exc

        with ThreadPoolExecutor(self.build_workers) as pool:
            built = list(pool.map(compile_one, kernels))
        results: list[MeasureResult | None] = [None] * len(kernels)
        artifacts: list[tuple[int, Artifact]] = []
        for i, (kernel, art) in enumerate(zip(kernels, built, strict=True)):
            if isinstance(art, BuildError):
                results[i] = MeasureResult(status="compile_error", error=str(art),
                                           **self._common(kernel, origin[i], toolchain))
            else:
                artifacts.append((i, art))
        return results, artifacts

    def measure_kernels(
        self,
        kernels: Sequence[KernelSource],
        *,
        sources: Sequence[tuple[str, float | None]] | None = None,
        progress: Progress | None = None,
    ) -> list[MeasureResult]:
        """Build and time already generated kernels (the seam fault-injection tests use)."""
        origin = list(sources) if sources is not None else [("manual", None)] * len(kernels)
        results, artifacts = self._build(kernels, origin)
        if progress:
            for failed in results:
                if failed is not None:
                    progress(failed)
        for i, art in artifacts:
            result = self._run(_Job(i, kernels[i], art),
                               self._common(kernels[i], origin[i], self.toolchain))
            results[i] = result
            if progress:
                progress(result)
        return [r for r in results if r is not None]

    def race(self, candidates: Sequence[Candidate],
             progress: Progress | None = None) -> list[MeasureResult]:
        """Time already measured candidates of one op against each other, unchecked, taking
        turns repeat by repeat in one worker (``worker.race_calls``): a slow phase of a
        shared machine then lands on every candidate's same rounds, and their medians
        compare like for like. Results in input order; a candidate that cannot be generated
        or built is reported as such, and one that fails in the worker fails the race for
        all (its error on each)."""
        if len(candidates) < 2:
            return self.measure(candidates, progress)
        results, kernels = self._generate(candidates)
        raced = self.race_kernels([k for _, k, _ in kernels],
                                  sources=[(c.source, c.predicted) for _, _, c in kernels])
        out = _merged(results, [i for i, _, _ in kernels], raced)
        if progress:
            for result in out:
                progress(result)
        return out

    def race_kernels(self, kernels: Sequence[KernelSource], *,
                     sources: Sequence[tuple[str, float | None]] | None = None
                     ) -> list[MeasureResult]:
        """:meth:`race` of already generated kernels (the seam fault-injection tests use)."""
        origin = list(sources) if sources is not None else [("manual", None)] * len(kernels)
        results, artifacts = self._build(kernels, origin)
        commons = [dict(self._common(kernels[i], origin[i], self.toolchain),
                        compile_s=a.compile_seconds, cached_build=a.cached)
                   for i, a in artifacts]
        raced = self._race([(kernels[i], a) for i, a in artifacts], commons)
        return _merged(results, [i for i, _ in artifacts], raced)

    def _race(self, racing: Sequence[tuple[KernelSource, Artifact]],
              commons: Sequence[dict[str, Any]]) -> list[MeasureResult]:
        if not racing:
            return []
        self._next_id += 1
        request = {
            "kind": "race", "id": self._next_id, "timing": self.timing.request(),
            "seed": self.timing.seed,
            "entries": [self._kernel_entry(k, a) for k, a in racing],
        }
        timeout_s = self.timing.timeout_s * len(racing)
        try:
            answer = self._worker_process().request(request, timeout_s)
        except WorkerCrashed as exc:
            self._forget("kernel")
            return [MeasureResult(status="runtime_error", error=str(exc), **c) for c in commons]
        if answer is None:
            self._forget("kernel")
            return [MeasureResult(status="timeout", error=f"no result within {timeout_s:g} s; "
                                  "worker killed", **c) for c in commons]
        if answer["status"] != "ok":
            return [MeasureResult(status=answer["status"], error=answer.get("error"), **c)
                    for c in commons]
        return [MeasureResult(status="ok", runtimes_s=tuple(samples), **c)
                for samples, c in zip(answer["runtimes_s"], commons, strict=True)]

    def _common(self, kernel: KernelSource, origin: tuple[str, float | None],
                toolchain: str) -> dict[str, Any]:
        return {
            "op": kernel.op,
            "schedule": kernel.schedule,
            "source_hash": kernel.source_hash,
            "flags": " ".join(kernel.flags),
            "compiler": toolchain,
            "codegen_version": kernel.codegen_version,
            "source": origin[0],
            "predicted": origin[1],
        }

    def _run(self, job: _Job, common: dict[str, Any]) -> MeasureResult:
        self._next_id += 1
        request = {
            "kind": "kernel",
            "id": self._next_id,
            "timing": self.timing.request(),
            "check": self.timing.check,
            "seed": self.timing.seed,
            **self._kernel_entry(job.kernel, job.artifact),
        }
        build_info: dict[str, Any] = {
            "compile_s": job.artifact.compile_seconds, "cached_build": job.artifact.cached,
        }
        try:
            worker = self._worker_process()
            answer = worker.request(request, self.timing.timeout_s)
        except WorkerCrashed as exc:
            self._forget("kernel")
            return MeasureResult(status="runtime_error", error=str(exc), **build_info, **common)
        if answer is None:
            self._forget("kernel")
            return MeasureResult(
                status="timeout",
                error=f"no result within {self.timing.timeout_s:g} s; worker killed",
                **build_info,
                **common,
            )
        result = MeasureResult(
            status=answer["status"],
            error=answer.get("error"),
            runtimes_s=tuple(answer.get("runtimes_s", ())),
            **build_info,
            **common,
        )
        return self._retime_if_noisy(result, request)

    def _kernel_entry(self, kernel: KernelSource, artifact: Artifact) -> dict[str, Any]:
        """What a worker request says of one kernel: its op, its library and how its
        weights are timed."""
        return {"op": kernel.op.text, "path": str(artifact.path), "backend": self.backend.name,
                "prepacked": self.prepacked(kernel.op),
                "cold_bytes": self._cold_bytes(kernel.op)}

    def _cold_bytes(self, op: OpSignature) -> int:
        """The bytes ``op``'s weights are rotated through when timed (0: kept warm): twice
        the L3 for constant weights under ``cold_weights``."""
        return 2 * self.hw.l3_bytes if self.timing.cold_weights and self.prepacked(op) else 0

    def prepacked(self, op: OpSignature) -> bool:
        """Whether ``op``'s kernels are timed with their weights packed once."""
        if self.timing.prepacked_weights is None:
            return op_kind(op.kind).prepacked_timing
        return self.timing.prepacked_weights

    def _retime_if_noisy(self, result: MeasureResult, request: dict[str, Any]) -> MeasureResult:
        """Time a noisy ``ok`` result again (unchecked); keep the attempt with the lowest median."""
        for _ in range(self.timing.noise_retries):
            if not (result.ok and noisy(result.runtimes_s, self.timing.noise_tolerance)):
                break
            self._next_id += 1
            try:
                answer = self._worker_process().request(
                    {**request, "id": self._next_id, "check": False}, self.timing.timeout_s)
            except WorkerCrashed:
                answer = None
            if answer is None:
                self._forget("kernel")
            if answer is None or answer.get("status") != "ok":
                # It passed once: keep that result rather than turn noise into a failure.
                break
            again = tuple(answer.get("runtimes_s", ()))
            if again and float(np.median(again)) < (result.median_s or float("inf")):
                result = replace(result, runtimes_s=again)
        return result

    def measure_numpy(self, op: OpSignature, threads: int) -> MeasureResult:
        """Time numpy (its BLAS limited to ``threads``) on ``op``: the same-run baseline."""
        self._next_id += 1
        request = {
            "kind": "numpy",
            "id": self._next_id,
            "op": op.text,
            "threads": threads,
            "timing": self.timing.request(),
            "seed": self.timing.seed,
            # Like for like: numpy's weights as cold as the kernels' (see _run).
            "cold_bytes": self._cold_bytes(op),
        }
        try:
            answer = self._worker_process("numpy").request(request, self.timing.timeout_s)
        except WorkerCrashed as exc:
            self._forget("numpy")
            return MeasureResult(op, None, "runtime_error", str(exc), source="numpy")
        if answer is None:
            self._forget("numpy")
            return MeasureResult(op, None, "timeout", "numpy baseline timed out", source="numpy")
        return MeasureResult(op, None, answer["status"], answer.get("error"),
                             tuple(answer.get("runtimes_s", ())), source="numpy")


def _merged(results: list[MeasureResult | None], indices: Sequence[int],
            timed: Sequence[MeasureResult]) -> list[MeasureResult]:
    """``results`` with ``timed[k]`` in place ``indices[k]``; the places left empty dropped."""
    for i, result in zip(indices, timed, strict=True):
        results[i] = result
    return [r for r in results if r is not None]


def noisy(runtimes_s: Sequence[float], tolerance: float) -> bool:
    """Whether the median repeat is more than ``tolerance`` slower than the fastest."""
    if len(runtimes_s) < 2:
        return False
    return float(np.median(runtimes_s)) > min(runtimes_s) * (1.0 + tolerance)


def best(results: Iterable[MeasureResult]) -> MeasureResult | None:
    """The fastest ``ok`` result by median, or None if none succeeded."""
    ok = [r for r in results if r.ok and r.median_s is not None]
    return min(ok, key=lambda r: r.median_s or float("inf")) if ok else None


def measure(op: OpSignature, schedules: Sequence[Schedule], hw: HardwareSpec,
            timing: TimingConfig | None = None) -> list[MeasureResult]:
    """Convenience: measure ``schedules`` for ``op`` with a throwaway runner."""
    with Runner(hw, timing) as runner:
        return runner.measure([Candidate(op, s) for s in schedules])


__all__ = [
    "STATUSES",
    "Candidate",
    "MeasureResult",
    "Runner",
    "TimingConfig",
    "TunecacheError",
    "best",
    "measure",
]
