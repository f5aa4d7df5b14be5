"""Latency on a shared machine: compiled models beside CPU-burning processes, by OpenMP wait
policy, against onnxruntime in the same conditions.

Each configuration runs in its own process (libgomp reads its wait policy once, when it
loads), in four conditions:

* ``quiet``: back-to-back runs on an otherwise idle machine;
* ``gaps``: the same, with ``--gap-ms`` of idle time before every timed run (a server whose
  requests arrive apart: the waiting threads have gone to sleep and the vCPUs halted);
* ``busy``: beside ``--burners`` processes that each spin one core;
* ``duty``: beside ``--burners`` processes that spin ``--duty ON/OFF`` milliseconds on and
  off (other services that come and go, the contention a farm node or deploy host sees most).

Both we and onnxruntime use ``--threads`` threads. The figure that matters is the growth
ratio, condition ÷ quiet, ours against onnxruntime's, measured in the same run. A busy
machine's timings scatter widely (the burners and our threads share time slices of a few
milliseconds), so every configuration runs ``--rounds`` times, the conditions and the
configurations interleaved, and each figure is the median of the rounds' medians.

    python benchmarks/busy_machine.py [--threads 2] [--repeat 40] [--rounds 3]
        [--model bert] [--policy "tunecache default"] [--gap-ms 100] [--duty 3/5] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from _report import median_ms  # noqa: E402

POLICIES: dict[str, dict[str, str]] = {
    "libgomp default (spin 300k)": {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": ""},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": ""},
    "spin 10k": {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "10000"},
    "spin 30k": {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "30000"},
    "spin 100k": {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "100000"},
    "spin 1M": {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "1000000"},
    "spin 3M": {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "3000000"},
    "tunecache default": {},
}
MODELS = ("bert", "mobilenet_v2")
CONDITIONS = ("quiet", "gaps", "busy", "duty")
DYNAMIC_ENGINE = "tunecache, dynamic split"


def _model(key: str) -> object:
    from onnx_support import bert_layer_model, mobilenet_v2_model

    if key == "bert":
        return bert_layer_model(17, True, batch=1, seq=128, hidden=768, heads=12)
    return mobilenet_v2_model(224)


def child(key: str, engine: str, threads: int, repeat: int, work: Path, gap_ms: float) -> None:
    """Time one model with one engine in this process; print {"ms": ...}."""
    import onnx
    from onnx_support import random_feeds

    model = _model(key)
    path = work / f"{key}.onnx"
    if not path.exists():
        onnx.save(model, path)  # type: ignore[arg-type]
    feeds = random_feeds(model)  # type: ignore[arg-type]
    if engine == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        def run() -> object:
            return session.run(names, feeds)
    else:
        from tunecache.cache.store import Store
        from tunecache.compiler.kinds.matmul import emit
        from tunecache.tuner.deploy import compile_model

        # The dynamic column split is off by default (ARCHITECTURE change 82); this run
        # measures it as an alternative.
        emit.DYNAMIC_SPLIT = engine == DYNAMIC_ENGINE

        compiled = compile_model(path, store=Store(work / "store"), policy="analytic",
                                 record_wanted=False, threads=threads)
        def run() -> object:
            return compiled.run(feeds)
    ms = median_ms(run, repeat, gap_ms / 1e3)
    print(json.dumps({"ms": ms}))


def _run_child(key: str, engine: str, env_patch: dict[str, str], args: argparse.Namespace,
               work: Path, gap_ms: float = 0.0) -> float:
    env = dict(os.environ)
    for name, value in env_patch.items():
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    out = subprocess.run(
        [sys.executable, __file__, "--child", key, engine, "--threads", str(args.threads),
         "--repeat", str(args.repeat), "--work", str(work), "--gap-ms", str(gap_ms)],
        env=env, capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["ms"])


def _burner_code(duty: tuple[float, float] | None) -> str:
    if duty is None:
        return "while True: pass"
    on, off = (ms / 1e3 for ms in duty)
    return ("import time\n"
            "while True:\n"
            "    t = time.perf_counter()\n"
            f"    while time.perf_counter() - t < {on}: pass\n"
            f"    time.sleep({off})\n")


def _burners(n: int, duty: tuple[float, float] | None) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", _burner_code(duty)]) for _ in range(n)]


def _measure(condition: str, key: str, engine: str, env_patch: dict[str, str],
             args: argparse.Namespace, work: Path) -> float:
    """One configuration's median in one condition (see the module docstring)."""
    if condition in ("quiet", "gaps"):
        gap = args.gap_ms if condition == "gaps" else 0.0
        return _run_child(key, engine, env_patch, args, work, gap)
    burners = _burners(args.burners, args.duty if condition == "duty" else None)
    try:
        return _run_child(key, engine, env_patch, args, work)
    finally:
        for b in burners:
            b.kill()
            b.wait()


def _duty(text: str) -> tuple[float, float]:
    try:
        on, off = (float(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected ON/OFF milliseconds, e.g. 3/5: {text!r}") from None
    if on <= 0 or off < 0:
        raise argparse.ArgumentTypeError(f"ON must be > 0 and OFF >= 0 ms: {text!r}")
    return on, off


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--policy", action="append", choices=sorted(POLICIES),
                        help="time only these wait policies (and onnxruntime); default: all")
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--dynamic-split", action="store_true",
                        help="also time each policy with matmuls' column units handed out "
                             "dynamically (kinds/matmul/emit.py DYNAMIC_SPLIT)")
    parser.add_argument("--model", action="append", choices=MODELS,
                        help="time only these models; default: all")
    parser.add_argument("--condition", action="append", choices=CONDITIONS,
                        help="time only these conditions (quiet always); default: all")
    parser.add_argument("--gap-ms", type=float, default=100.0,
                        help="idle milliseconds before each timed run in the gaps condition")
    parser.add_argument("--duty", type=_duty, default=(3.0, 5.0), metavar="ON/OFF",
                        help="the duty burners' milliseconds on and off (default 3/5)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "ENGINE"))
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.threads, args.repeat, args.work, args.gap_ms)
        return
    from _report import write_section

    work = Path(tempfile.mkdtemp(prefix="busy-machine-"))
    os.environ["TUNECACHE_BUILD_CACHE"] = str(work / "kernels")
    configs = [(name, "tunecache", patch) for name, patch in POLICIES.items()]
    configs.append(("onnxruntime", "onnxruntime", {}))
    if args.policy:
        configs = [c for c in configs if c[0] in args.policy or c[0] == "onnxruntime"]
    if args.dynamic_split:
        configs[-1:-1] = [(f"{label}, dynamic split", DYNAMIC_ENGINE, patch)
                          for label, engine, patch in configs if engine == "tunecache"]
    conditions = ["quiet", *(c for c in CONDITIONS[1:]
                             if not args.condition or c in args.condition)]
    rows = []
    for key in args.model or MODELS:
        _run_child(key, "tunecache", {}, args, work)  # build every kernel once, untimed
        samples: dict[str, dict[str, list[float]]] = {
            c[0]: {cond: [] for cond in conditions} for c in configs}
        for _ in range(args.rounds):
            for label, engine, patch in configs:
                for cond in conditions:
                    samples[label][cond].append(_measure(cond, key, engine, patch, args, work))
                print(key, label, ", ".join(f"{cond} {samples[label][cond][-1]:.2f} ms"
                                            for cond in conditions), flush=True)
        rows += [(key, label, {cond: statistics.median(v) for cond, v in by_cond.items()})
                 for label, by_cond in samples.items()]
    text = _table(rows, conditions, args)
    print(text)
    if not args.no_write:
        write_section(text)


def _table(rows: list[tuple[str, str, dict[str, float]]], conditions: list[str],
           args: argparse.Namespace) -> str:
    from _report import git_revision, machine_summary

    ort = {key: ms for key, label, ms in rows if label == "onnxruntime"}
    others = conditions[1:]
    on, off = args.duty
    lines = [machine_summary(), "",
             f"Revision `{git_revision()}`. {args.threads} threads for every engine; gaps = "
             f"{args.gap_ms:g} ms idle before each timed run; busy = beside {args.burners} "
             f"processes spinning one core each; duty = beside {args.burners} processes "
             f"spinning {on:g} ms on, {off:g} ms off; medians of {args.rounds} interleaved "
             f"rounds' medians of {args.repeat} runs; analytic schedules (empty store); each "
             "figure from its own process; growth = condition ÷ quiet, and in bold that "
             "growth ÷ onnxruntime's.", "",
             "| model | engine / wait policy | " + " | ".join(conditions) + " | "
             + " | ".join(f"{c} growth" for c in others) + " |",
             "|---|---|" + "---|" * (len(conditions) + len(others))]
    for key, label, ms in rows:
        growth = [ms[c] / ms["quiet"] for c in others]
        vs_ort = [g / (ort[key][c] / ort[key]["quiet"]) for g, c in zip(growth, others, strict=True)]
        lines.append(f"| {key} | {label} | " + " | ".join(f"{ms[c]:.1f} ms" for c in conditions)
                     + " | " + " | ".join(f"{g:.2f}x (**{v:.2f}**)"
                                          for g, v in zip(growth, vs_ort, strict=True)) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
