"""Latency of the CNN zoo compiled by tunecache, against onnxruntime and OpenVINO.

For each model of ``benchmarks/cnn_zoo.py`` (batch 1, 224x224, random weights) and each
thread count: tunecache untuned (analytic policy, fresh store, fresh build cache, the
hardware spec's cores set to the thread count), onnxruntime (``intra_op_num_threads``, all
graph optimisations) and OpenVINO (``INFERENCE_NUM_THREADS``, latency hint, f32 inference
precision). Every measurement runs in its own process with ``OMP_NUM_THREADS`` and the BLAS
thread counts set to the same number, and reports the median latency over ``--repeat`` runs,
its peak RSS, and (tunecache) the arena of the compiled program and the cold and warm
compile times. The error column is max |ours - onnxruntime| / max |onnxruntime| on the same
input.

With ``--tune TRIALS``, tunecache is also measured **tuned**: in its own process, a
tuning job (``TRIALS`` per distinct op, no refinement) on the ops the compiled model runs
(layouts planned for the spec: ``kernel_ops(path, hw=...)``) into a fresh store, published,
then the model compiled against it (``balanced``: every op a cache hit) and timed.

How the engines are timed (``--mode``):

* ``lockstep`` (the default): every engine is opened at once, each in its own process, and
  the parent asks each for one timed inference in turn, ``--repeat`` times. The order
  rotates, and each inference starts once the previous engine's process has stopped using
  CPU (onnxruntime's workers spin for about 45 ms after an inference). Each latency is the
  engine's median; each ratio to the faster peer is the median over those rounds of the
  ratio within the round. A slow phase of a shared VM then lands on every engine alike; on
  this project's VMs the per-process figures of the other mode moved by 20-40% between
  minutes.
* ``rounds``: each engine measured ``--repeat`` times in its own process, ``--rounds``
  times, interleaved; each latency is the median round, each ratio the median over rounds.

    python benchmarks/model_zoo_latency.py [--only squeezenet1_1,vgg16] [--threads 1,2]
        [--repeat 20] [--size 224] [--tune 6] [--mode lockstep|rounds] [--no-write]
    python benchmarks/model_zoo_latency.py --zoo transformers [--only bert_base_s128,...]
    python benchmarks/model_zoo_latency.py --zoo vision [--only ssdlite320,...]

``--zoo transformers`` runs the full-size transformers of ``benchmarks/transformer_zoo.py``
(BERT-base, GPT-2 prefill and decode, ViT-B/16, a small Llama; exported with torch, which it
then needs) with their token, mask and past inputs, into its own BENCHMARKS.md section;
``--zoo vision`` torchvision's detection and segmentation models of
``benchmarks/vision_zoo.py`` (exported with torch and torchvision); ``--zoo handwritten``
the U-Nets, style-transfer network and recurrent stacks of ``benchmarks/handwritten_zoo.py``.

OpenVINO is an optional extra: ``pip install 'tunecache[openvino]'``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _report import median_ms  # noqa: E402

ENGINES = ("onnxruntime", "tunecache", "openvino")
INSTALL_HINT = ("error: OpenVINO is not installed; install the extra with "
                "pip install 'tunecache[openvino]' (or pip install openvino)")
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
IDLE_PROBE_S = 0.012
"""Longer than two scheduler ticks: a running thread's CPU time is only brought up to date
at a tick (4 ms here), so a shorter window can read a spinning thread as idle."""
IDLE_WAIT_MAX_S = 0.3


@dataclass(frozen=True, slots=True)
class Measurement:
    """One engine's figures for one model at one thread count; ``error`` when it failed."""

    ms: float = float("nan")
    rss_mib: float = float("nan")
    arena_mib: float = float("nan")
    kernel_pct: float = float("nan")
    cold_s: float = float("nan")
    warm_s: float = float("nan")
    rel_err: float = float("nan")
    tune_s: float = float("nan")
    hits: float = float("nan")
    error: str = ""
    rounds: tuple[float, ...] = ()
    """Each round's median (NaN where that round failed), for the ratios by round."""


# -- child processes: one engine, one model, one thread count --------------------------------


Feeds = dict[str, np.ndarray]


def _shapes(feeds: Feeds) -> dict[str, tuple[int, ...]]:
    return {name: tuple(value.shape) for name, value in feeds.items()}


def _first_output(compiled: Any, feeds: Feeds) -> np.ndarray:
    return compiled.run(feeds)[compiled.graph.outputs[0].name]


@dataclass(frozen=True)
class Opened:
    """One engine ready to run the model: ``run`` is one inference, ``output`` its first
    output, ``extra`` the figures of opening it (compile times, arena, cache hits)."""

    run: Callable[[], object]
    output: Callable[[], np.ndarray]
    extra: dict[str, float]
    compiled: Any = None
    """tunecache's compiled model, for the in-kernels share; None for the peers."""


def _open_tunecache(path: Path, feeds: Feeds, threads: int, work: Path) -> Opened:
    from tunecache.cache.store import Store
    from tunecache.compiler.hardware import local_spec
    from tunecache.tuner.deploy import compile_model

    hw = replace(local_spec(), cores=threads)
    store = Store(work / f"store-{path.stem}-{threads}")
    shapes = _shapes(feeds)
    start = time.perf_counter()
    compile_model(path, store=store, policy="analytic", record_wanted=False, hw=hw,
                  input_shapes=shapes)
    cold_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled = compile_model(path, store=store, policy="analytic", record_wanted=False, hw=hw,
                             input_shapes=shapes)
    warm_s = time.perf_counter() - start
    return Opened(lambda: compiled.run(feeds), lambda: _first_output(compiled, feeds),
                  {"cold_s": cold_s, "warm_s": warm_s}, compiled)


def _kernel_pct(compiled: Any, feeds: Feeds, repeat: int, run_ms: float) -> float:
    """Generated kernels' time per run (each step timed inside the runner, ``tunecache run
    --profile``, medians summed) as a share of the timed latency ``run_ms``: the rest is
    runner copies, numpy steps and Python. The profiled runs themselves are not the
    denominator: they take the general path and a clock around every step."""
    profile = compiled.profile(feeds, runs=min(repeat, 10))
    kernels = profile.seconds_by("where").get("kernel", 0.0)
    return 100.0 * kernels * 1e3 / run_ms if run_ms else float("nan")


def _tune(path: Path, feeds: Feeds, threads: int, work: Path, trials: int) -> dict[str, float]:
    """The tuning job for ``--tune``: the ops the compiled model runs, into a fresh store."""
    from tunecache.cache.store import Store
    from tunecache.compiler.frontend import kernel_ops
    from tunecache.compiler.hardware import local_spec
    from tunecache.datasets.suites import Workload
    from tunecache.tuner.jobs import JobOptions, run_job

    hw = replace(local_spec(), cores=threads)
    store = Store(work / f"tuned-{path.stem}-{threads}")
    start = time.perf_counter()
    workloads = [Workload(op, count, label)
                 for op, count, label in kernel_ops(path, _shapes(feeds), hw=hw)]
    run_job(workloads, hw, store, JobOptions(trials=trials, refine=False, baseline=False))
    store.publish(hw.hw_id)
    return {"tune_s": time.perf_counter() - start}


def _open_tuned(path: Path, feeds: Feeds, threads: int, work: Path) -> Opened:
    from tunecache.cache.store import Store
    from tunecache.compiler.hardware import local_spec
    from tunecache.tuner.deploy import compile_model

    hw = replace(local_spec(), cores=threads)
    store = Store(work / f"tuned-{path.stem}-{threads}")
    compiled = compile_model(path, store=store, policy="balanced", record_wanted=False, hw=hw,
                             input_shapes=_shapes(feeds))
    hits = sum(e.action == "cache" for e in compiled.plan) / max(1, len(compiled.plan))
    return Opened(lambda: compiled.run(feeds), lambda: _first_output(compiled, feeds),
                  {"hits": hits})


def _peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM): unlike ``ru_maxrss`` it starts afresh at
    exec, so the parent's models do not count."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _open_onnxruntime(path: Path, feeds: Feeds, threads: int) -> Opened:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return Opened(lambda: session.run(None, feeds), lambda: session.run(None, feeds)[0], {})


def _open_openvino(path: Path, feeds: Feeds, threads: int) -> Opened:
    import openvino as ov  # type: ignore[import-untyped]

    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", {
        "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()

    def output() -> np.ndarray:
        request.infer(feeds)
        return np.array(request.get_output_tensor(0).data)

    return Opened(lambda: request.infer(feeds), output, {})


def _open(engine: str, path: Path, feeds: Feeds, threads: int, work: Path) -> Opened:
    if engine == "tunecache":
        return _open_tunecache(path, feeds, threads, work)
    if engine == "tuned":
        return _open_tuned(path, feeds, threads, work)
    if engine == "onnxruntime":
        return _open_onnxruntime(path, feeds, threads)
    return _open_openvino(path, feeds, threads)


def _closing_figures(opened: Opened, feeds: Feeds, repeat: int, path: Path, engine: str,
                     threads: int, work: Path) -> dict[str, float]:
    """Save the engine's output beside the model; its peak RSS and in-kernels share."""
    np.save(work / f"{path.stem}-{engine}-{threads}.npy", opened.output(), allow_pickle=False)
    extra = dict(opened.extra)
    if opened.compiled is not None:  # the program is built by the first run
        program = opened.compiled.program
        extra["arena_mib"] = program.arena_bytes / 2**20 if program else float("nan")
        # against back-to-back runs, as the profile's are: a lockstep inference also wakes
        # the kernels' sleeping threads, which is not time outside the kernels
        extra["kernel_pct"] = _kernel_pct(opened.compiled, feeds, repeat,
                                          median_ms(opened.run, min(repeat, 10)))
    return {"rss_mib": _peak_rss_mib(), **extra}


def _error_line(exc: Exception) -> str:
    return json.dumps({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})


def _serve(opened: Opened) -> list[float]:
    """Lockstep: one timed inference per ``run`` line on stdin, its milliseconds printed,
    until ``finish``; returns the times."""
    print(json.dumps({"ready": True}), flush=True)
    times = []
    for line in sys.stdin:
        if line.strip() != "run":
            break
        start = time.perf_counter()
        opened.run()
        times.append((time.perf_counter() - start) * 1e3)
        print(f"{times[-1]:.6f}", flush=True)
    return times


def child(engine: str, path: Path, threads: int, repeat: int, work: Path,
          trials: int = 0, serve: bool = False) -> None:
    """Measure ``engine`` on the model at ``path``; save its output beside the model and
    print one JSON line of figures (or ``{"error": ...}``). With ``serve``, the parent
    times the inferences in lockstep with the other engines (``_serve``)."""
    with np.load(work / f"{path.stem}-feeds.npz", allow_pickle=False) as data:
        feeds = {name: data[name] for name in data.files}
    if engine == "tune":
        print(json.dumps(_tune(path, feeds, threads, work, trials)))
        return
    try:
        opened = _open(engine, path, feeds, threads, work)
        if serve:
            opened.run()  # the warm-up
            ms = statistics.median(_serve(opened) or [float("nan")])
        else:
            ms = median_ms(opened.run, repeat)
        figures = _closing_figures(opened, feeds, repeat, path, engine, threads, work)
    except Exception as exc:  # reported as a value: the row says which engine failed, and why
        print(_error_line(exc), flush=True)
        return
    print(json.dumps({"ms": ms, **figures}), flush=True)


# -- parent --------------------------------------------------------------------------------


def _child_env(engine: str, key: str, threads: int, work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({name: str(threads) for name in THREAD_ENV})
    # untuned: cold on its first open; the tuning job and the tuned runs share another
    group = "tuned-" if engine in ("tune", "tuned") else ""
    env["TUNECACHE_BUILD_CACHE"] = str(work / f"kernels-{group}{key}-{threads}")
    env.pop("TUNECACHE_HARDWARE", None)
    return env


def _child_argv(engine: str, key: str, threads: int, args: argparse.Namespace,
                work: Path) -> list[str]:
    return [sys.executable, __file__, "--child", engine, str(work / f"{key}.onnx"),
            "--threads", str(threads), "--repeat", str(args.repeat), "--work", str(work),
            "--tune", str(args.tune)]


def _figures(line: str) -> Measurement:
    data = json.loads(line)
    if "error" in data:
        return Measurement(error=str(data["error"]))
    return Measurement(**data)


def _measure(engine: str, key: str, threads: int, args: argparse.Namespace,
             work: Path) -> Measurement:
    proc = subprocess.run(_child_argv(engine, key, threads, args, work),
                          env=_child_env(engine, key, threads, work), capture_output=True,
                          text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Measurement(error=f"exit {proc.returncode}: {tail}")
    return _figures(lines[-1])


def _rounds(engines: Sequence[str], key: str, threads: int, args: argparse.Namespace,
            work: Path) -> dict[str, Measurement]:
    """Every engine measured ``--rounds`` times, interleaved (a burst of load on the shared
    machine hits every engine alike); latency is the median of the rounds' medians, the
    other figures those of the first round (its tunecache compile is the cold one)."""
    runs: dict[str, list[Measurement]] = {e: [] for e in engines}
    for _ in range(args.rounds):
        for engine in engines:
            runs[engine].append(_measure(engine, key, threads, args, work))
    out = {}
    for engine, ms in runs.items():
        good = [x.ms for x in ms if not x.error]
        out[engine] = replace(ms[0], ms=statistics.median(good) if good else float("nan"),
                              rounds=tuple(float("nan") if x.error else x.ms for x in ms))
    return out


@dataclass
class _Server:
    """A child process holding one opened engine, timing inferences on request."""

    engine: str
    proc: subprocess.Popen[str]
    stderr: Path
    times: list[float] = field(default_factory=list)
    error: str = ""

    def request(self, command: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except OSError:
            return ""
        return self.proc.stdout.readline().strip()

    def fail(self) -> None:
        self.proc.wait()
        tail = (self.stderr.read_text(errors="replace").strip().splitlines()
                or ["no output"])[-1]
        self.error = self.error or f"exit {self.proc.returncode}: {tail}"


def _cpu_s(pid: int) -> float | None:
    """CPU seconds used so far by every thread of process ``pid`` (None off Linux)."""
    try:
        return sum(int((task / "schedstat").read_text().split()[0])
                   for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9
    except (OSError, ValueError):
        return None


def _wait_idle(pid: int) -> None:
    """Return once process ``pid`` has stopped using CPU: an engine's workers may spin after
    an inference (onnxruntime's did for about 45 ms at two threads), and spinning beside the
    next engine's inference would slow it."""
    before = _cpu_s(pid)
    if before is None:  # no CPU times to read: wait as long as any spin lasts
        time.sleep(IDLE_WAIT_MAX_S)
        return
    deadline = time.perf_counter() + IDLE_WAIT_MAX_S
    while time.perf_counter() < deadline:
        time.sleep(IDLE_PROBE_S)
        after = _cpu_s(pid)
        if after is None or after - before < IDLE_PROBE_S / 10:
            return
        before = after


def _start(engine: str, key: str, threads: int, args: argparse.Namespace,
           work: Path) -> _Server:
    """Open ``engine`` in its own process and wait until it is ready to time inferences."""
    stderr = work / f"{key}-{engine}-{threads}.err"
    with stderr.open("w") as sink:
        proc = subprocess.Popen([*_child_argv(engine, key, threads, args, work), "--serve"],
                                env=_child_env(engine, key, threads, work),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sink,
                                text=True)
    server = _Server(engine, proc, stderr)
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    if not first.startswith('{"ready"'):
        server.error = _figures(first).error if first else ""
        server.fail()
    return server


def _lockstep(engines: Sequence[str], key: str, threads: int, args: argparse.Namespace,
              work: Path) -> dict[str, Measurement]:
    """Every engine open at once, each in its own process, timed one inference at a time
    in turn (the order rotating each round; the next starts once the last engine's
    process is idle, ``_wait_idle``): a slow phase of a shared machine lands on every engine's
    same rounds, so the per-round ratios stay true where separate processes minutes apart
    disagree."""
    servers = [_start(engine, key, threads, args, work) for engine in engines]
    for i in range(args.repeat):
        for server in servers[i % len(servers):] + servers[:i % len(servers)]:
            answer = "" if server.error else server.request("run")
            if not answer:
                if not server.error:
                    server.fail()
                server.times.append(float("nan"))
                continue
            server.times.append(float(answer))
            _wait_idle(server.proc.pid)
    out = {}
    for server in servers:
        figures = Measurement(error=server.error)
        if not server.error:
            last = server.request("finish")
            server.proc.wait()
            if not last:
                server.fail()
            figures = _figures(last) if last else Measurement(error=server.error)
        out[server.engine] = replace(figures, rounds=tuple(server.times))
    return out


def paired_ratio(ours: Measurement, peers: Sequence[Measurement]) -> float:
    """The median over rounds of ours ÷ the faster peer in the same round. The engines of a
    round run within a minute of each other, so a slow phase of the shared machine that
    lasts minutes (this project's VMs have them) slows the numerator and the denominator
    alike, where a ratio of medians over all rounds can take them from different phases."""
    ratios = []
    for i, mine in enumerate(ours.rounds):
        theirs = [p.rounds[i] for p in peers if i < len(p.rounds) and not np.isnan(p.rounds[i])]
        if theirs and not np.isnan(mine):
            ratios.append(mine / min(theirs))
    return statistics.median(ratios) if ratios else float("nan")


def _rel_err(work: Path, key: str, engine: str, threads: int) -> float:
    ref = np.load(work / f"{key}-onnxruntime-{threads}.npy", allow_pickle=False)
    got = np.load(work / f"{key}-{engine}-{threads}.npy", allow_pickle=False)
    if got.shape != ref.shape:  # a detector finding another number of boxes
        return float("inf")
    scale = float(np.max(np.abs(ref), initial=0.0)) or 1.0
    return float(np.max(np.abs(got - ref), initial=0.0)) / scale


EXPORTED = {"transformers": ("transformer_zoo", "transformers"),
            "vision": ("vision_zoo", "torchvision"), "handwritten": ("handwritten_zoo", "torch")}
"""The zoos exported with torch: ``--zoo`` -> (module, the package it needs besides torch).
Each module has ZOO, DEFAULT, INSTALL_HINT and ``export(key, dir) -> (path, feeds)``."""


def _zoo(name: str) -> tuple[Sequence[str], Sequence[str]]:
    """The keys of zoo ``name`` and those run when ``--only`` is not given."""
    if name == "cnn":
        from cnn_zoo import ZOO

        return tuple(ZOO), tuple(ZOO)
    module = importlib.import_module(EXPORTED[name][0])
    return tuple(module.ZOO), tuple(module.DEFAULT)


def _selected(only: str | None, zoo: str) -> list[str] | str:
    """Zoo keys named by ``--only`` (exact or a unique prefix), or an error message."""
    ZOO, default = _zoo(zoo)
    if not only:
        return list(default)
    keys = []
    for want in only.split(","):
        matches = [k for k in ZOO if k == want] or [k for k in ZOO if k.startswith(want)]
        if len(matches) != 1:
            return f"--only {want!r} names no single zoo model; choose from {', '.join(ZOO)}"
        keys.append(matches[0])
    return keys


def _fmt(value: float, spec: str, unit: str = "") -> str:
    return "—" if np.isnan(value) else f"{value:{spec}}{unit}"


def _row(key: str, threads: int, m: dict[str, Measurement]) -> str:
    ours, ort, ov = m["tunecache"], m["onnxruntime"], m["openvino"]
    tuned = m.get("tuned", Measurement())
    failed = "; ".join(f"{e}: {x.error}" for e, x in m.items() if x.error)
    untuned_ratio, tuned_ratio = (paired_ratio(x, (ort, ov)) for x in (ours, tuned))
    return (f"| {key} | {threads} | {_fmt(ours.ms, '.2f', ' ms')} | {_fmt(ort.ms, '.2f', ' ms')} | "
            f"{_fmt(ov.ms, '.2f', ' ms')} | **{_fmt(untuned_ratio, '.2f', 'x')}** | "
            f"{_fmt(tuned.ms, '.2f', ' ms')} | **{_fmt(tuned_ratio, '.2f', 'x')}** | "
            f"{_fmt(tuned.tune_s, '.0f', ' s')} | {_fmt(tuned.hits * 100, '.0f', '%')} | "
            f"{_fmt(ours.rel_err, '.1e')} / {_fmt(tuned.rel_err, '.1e')} / "
            f"{_fmt(ov.rel_err, '.1e')} | "
            f"{_fmt(ours.rss_mib, '.0f')} / {_fmt(ort.rss_mib, '.0f')} / "
            f"{_fmt(ov.rss_mib, '.0f')} MiB | {_fmt(ours.arena_mib, '.1f', ' MiB')} | "
            f"{_fmt(ours.kernel_pct, '.1f', '%')} | "
            f"{_fmt(ours.cold_s, '.1f', ' s')} | "
            f"{_fmt(ours.warm_s, '.2f', ' s')} | {failed} |")


def tuned_note(args: argparse.Namespace) -> str:
    """What the tuned columns are (or that they were not measured)."""
    if not args.tune:
        return "Tuned columns: not measured (run with `--tune TRIALS`)."
    return (f"Tuned: a tuning job of {args.tune} trials per distinct op (no refinement) on the "
            "ops the compiled model runs, in its own process, then the tuned engine compiles "
            "against its store; the tuning job column is its wall time.")


def _models(args: argparse.Namespace) -> str:
    if args.zoo == "cnn":
        return (f"Zoo models of `benchmarks/cnn_zoo.py` (batch 1, {args.size}x{args.size}, "
                "random weights)")
    if args.zoo == "handwritten":
        return ("Hand-written networks of `benchmarks/handwritten_zoo.py` (U-Nets, a "
                "style-transfer network, LSTM and GRU stacks; random weights, batch 1, "
                "static input size, exported by torch.onnx.export's TorchScript path at "
                "opset 17)")
    if args.zoo == "vision":
        return ("torchvision's detection, segmentation, ResNeXt and video models of "
                "`benchmarks/vision_zoo.py` "
                "(random weights, batch 1, static image size, exported by torch.onnx.export: "
                "TorchScript at opset 17, `_dynamo` keys the dynamo path at opset 18)")
    return ("Transformers of `benchmarks/transformer_zoo.py` (Hugging Face configs, random "
            "weights, exported by torch.onnx.export's TorchScript path at opset 17 with "
            "symbolic batch and sequence axes; compiled for the timed input's shapes)")


def _timing(args: argparse.Namespace) -> str:
    if args.mode == "lockstep":
        return (f"Engines in lockstep: each in its own process, all open at once, one timed "
                f"inference of each in turn, {args.repeat} rounds (the order rotating); "
                "latencies: each engine's median; ÷ best peer: the median over rounds of "
                "ours ÷ the faster peer of the same round")
    return (f"Each figure from its own process, medians of {args.repeat} runs, engines "
            f"interleaved over {args.rounds} rounds (latencies: the median round; ÷ best "
            "peer: the median over rounds of ours ÷ the faster peer of the same round)")


def _report(rows: Sequence[str], args: argparse.Namespace, versions: str) -> str:
    from _report import git_revision, machine_summary

    return "\n".join([
        machine_summary(), "",
        f"Revision `{git_revision()}`. {_models(args)}; {versions}. {_timing(args)}; "
        "tunecache untuned (analytic schedules, "
        "empty store and build cache, so the shipped seed serves what it holds for this "
        "machine; spec cores = threads; warm compile = the same compile "
        "again in that process); error = max |x - onnxruntime| ÷ max |onnxruntime|; peak RSS "
        "of each process (ours includes compiling); arena = the peak bytes of our compiled "
        "program's planned intermediates (outputs are fresh arrays, weights are constants); "
        "in kernels = generated kernels' time per untuned run (each step timed inside the "
        "runner, medians summed) ÷ the latency of back-to-back untuned runs (the rest: the "
        "runner's copies, numpy steps and Python).",
        "",
        f"{tuned_note(args)}", "",
        "| model | threads | tunecache untuned | onnxruntime | OpenVINO | untuned ÷ best peer | "
        "tunecache tuned | tuned ÷ best peer | tuning job | cache hits | "
        "rel. err (untuned / tuned / OpenVINO) | peak RSS (ours / ORT / OV) | arena (ours) | "
        "in kernels | cold compile | warm compile | failures |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows])


def _prepare(args: argparse.Namespace, key: str, work: Path) -> Feeds:
    """Write ``{key}.onnx`` into ``work``; returns the inputs of one inference."""
    if args.zoo in EXPORTED:
        return importlib.import_module(EXPORTED[args.zoo][0]).export(key, work)[1]
    import onnx
    from cnn_zoo import ZOO

    onnx.save(ZOO[key](args.size), work / f"{key}.onnx")
    return {"image": np.random.default_rng(0).standard_normal(
        (1, 3, args.size, args.size)).astype(np.float32)}


def _measure_all(keys: Sequence[str], threads: Sequence[int], args: argparse.Namespace,
                 work: Path) -> list[str]:
    """One table row per model and thread count, printed as it is measured."""
    rows = []
    for key in keys:
        print(f"{key}: preparing", file=sys.stderr, flush=True)
        np.savez(work / f"{key}-feeds.npz", **_prepare(args, key, work))
        for n in threads:
            # onnxruntime first: its output is the reference the others' errors are against
            engines = ENGINES + (("tuned",) if args.tune else ())
            tuning = _measure("tune", key, n, args, work) if args.tune else Measurement()
            measure = _lockstep if args.mode == "lockstep" else _rounds
            m = measure(engines, key, n, args, work)
            if args.tune:
                m["tuned"] = replace(m["tuned"], tune_s=tuning.tune_s,
                                     error=m["tuned"].error or tuning.error)
            for engine in engines[1:]:
                if not (m[engine].error or m["onnxruntime"].error):
                    m[engine] = replace(m[engine], rel_err=_rel_err(work, key, engine, n))
            rows.append(_row(key, n, m))
            print(rows[-1], flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--zoo", choices=("cnn", *EXPORTED), default="cnn",
                        help="benchmarks/cnn_zoo.py, transformer_zoo.py, vision_zoo.py or "
                        "handwritten_zoo.py")
    parser.add_argument("--only", default=None, help="comma-separated zoo keys (or prefixes)")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--mode", choices=("lockstep", "rounds"), default="lockstep",
                        help="lockstep: every engine open at once, one inference of each in "
                             "turn, --repeat times; rounds: one process per engine and "
                             "round, --rounds times")
    parser.add_argument("--rounds", type=int, default=3,
                        help="with --mode rounds: measurements of every engine, interleaved "
                             "(median of rounds)")
    parser.add_argument("--tune", type=int, default=0, metavar="TRIALS",
                        help="also measure tunecache tuned with TRIALS per op")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--section", default=None,
                        help="the block of this script's BENCHMARKS.md section to write "
                             "(default: model_zoo, transformer_zoo or vision_zoo, with _tuned when "
                             "tuning)")
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "MODEL"))
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], Path(args.child[1]), int(args.threads), args.repeat, args.work,
              args.tune, args.serve)
        return 0
    keys = _selected(args.only, args.zoo)
    try:
        threads = [int(t) for t in args.threads.split(",")]
    except ValueError:
        threads = []
    if isinstance(keys, str) or not threads or min(threads) < 1:
        print(f"error: {keys if isinstance(keys, str) else '--threads takes positive integers'}",
              file=sys.stderr)
        return 2
    try:
        import openvino
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        return 1
    if args.zoo in EXPORTED and any(importlib.util.find_spec(p) is None
                                    for p in ("torch", EXPORTED[args.zoo][1])):
        print(importlib.import_module(EXPORTED[args.zoo][0]).INSTALL_HINT, file=sys.stderr)
        return 1
    import onnxruntime

    work = Path(tempfile.mkdtemp(prefix="model-zoo-"))
    try:  # exports, feeds, stores and kernels: gigabytes for the transformers
        rows = _measure_all(keys, threads, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    versions = (f"onnxruntime {onnxruntime.__version__}, OpenVINO "
                f"{openvino.get_version().split('-')[0]}")
    text = _report(rows, args, versions)
    print(text)
    if not args.no_write:
        from _report import write_section

        prefix = "model_zoo" if args.zoo == "cnn" else EXPORTED[args.zoo][0]
        write_section(text, args.section or (f"{prefix}_tuned" if args.tune else prefix))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
