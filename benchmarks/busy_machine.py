"""Latency on a shared machine: compiled models beside a CPU-burning process, by OpenMP wait
policy, against onnxruntime in the same conditions.

Each configuration runs in its own process (libgomp reads its wait policy once, when it
loads), first on a quiet machine and then beside ``--burners`` processes that each spin one
core. Both we and onnxruntime use ``--threads`` threads. The figure that matters is the
growth ratio, busy ÷ quiet, ours against onnxruntime's, measured in the same run. A busy
machine's timings scatter widely (the burners and our threads share time slices of a few
milliseconds), so every configuration runs ``--rounds`` times, quiet and busy alternated and
the configurations interleaved, and each figure is the median of the rounds' medians.

    python benchmarks/busy_machine.py [--threads 2] [--repeat 40] [--rounds 3]
        [--policy "tunecache default"] [--no-write]
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
    "tunecache default": {},
}
MODELS = ("bert", "mobilenet_v2")


def _model(key: str) -> object:
    from onnx_support import bert_layer_model, mobilenet_v2_model

    if key == "bert":
        return bert_layer_model(17, True, batch=1, seq=128, hidden=768, heads=12)
    return mobilenet_v2_model(224)


def child(key: str, engine: str, threads: int, repeat: int, work: Path) -> None:
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
        ms = median_ms(lambda: session.run(names, feeds), repeat)
    else:
        from tunecache.cache.store import Store
        from tunecache.tuner.deploy import compile_model

        compiled = compile_model(path, store=Store(work / "store"), policy="analytic",
                                 record_wanted=False)
        ms = median_ms(lambda: compiled.run(feeds), repeat)
    print(json.dumps({"ms": ms}))


def _run_child(key: str, engine: str, env_patch: dict[str, str], args: argparse.Namespace,
               work: Path) -> float:
    env = dict(os.environ)
    for name, value in env_patch.items():
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    out = subprocess.run(
        [sys.executable, __file__, "--child", key, engine, "--threads", str(args.threads),
         "--repeat", str(args.repeat), "--work", str(work)],
        env=env, capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["ms"])


def _burners(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _busy_child(key: str, engine: str, env_patch: dict[str, str], args: argparse.Namespace,
                work: Path) -> float:
    burners = _burners(args.burners)
    try:
        return _run_child(key, engine, env_patch, args, work)
    finally:
        for b in burners:
            b.kill()
            b.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--policy", action="append", choices=sorted(POLICIES),
                        help="time only these wait policies (and onnxruntime); default: all")
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "ENGINE"))
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.threads, args.repeat, args.work)
        return
    from _report import git_revision, machine_summary, write_section

    work = Path(tempfile.mkdtemp(prefix="busy-machine-"))
    os.environ["TUNECACHE_BUILD_CACHE"] = str(work / "kernels")
    configs = [(name, "tunecache", patch) for name, patch in POLICIES.items()]
    configs.append(("onnxruntime", "onnxruntime", {}))
    if args.policy:
        configs = [c for c in configs if c[0] in args.policy or c[0] == "onnxruntime"]
    rows = []
    for key in MODELS:
        _run_child(key, "tunecache", {}, args, work)  # build every kernel once, untimed
        samples: dict[str, tuple[list[float], list[float]]] = {c[0]: ([], []) for c in configs}
        for _ in range(args.rounds):
            for label, engine, patch in configs:
                quiet, busy = samples[label]
                quiet.append(_run_child(key, engine, patch, args, work))
                busy.append(_busy_child(key, engine, patch, args, work))
                print(key, label, f"quiet {quiet[-1]:.2f} ms, busy {busy[-1]:.2f} ms", flush=True)
        rows += [(key, label, statistics.median(q), statistics.median(b))
                 for label, (q, b) in samples.items()]
    ort_growth = {k: b / q for k, lbl, q, b in rows if lbl == "onnxruntime"}
    lines = [machine_summary(), "",
             f"Revision `{git_revision()}`. {args.threads} threads for every engine; busy = "
             f"beside {args.burners} processes spinning one core each; medians of "
             f"{args.rounds} interleaved rounds' medians of {args.repeat} runs; analytic "
             "schedules (empty store); each figure from its own process.",
             "", "| model | engine / wait policy | quiet | busy | busy ÷ quiet | growth ÷ "
             "onnxruntime's |", "|---|---|---|---|---|---|"]
    for key, label, quiet, busy in rows:
        growth = busy / quiet
        lines.append(f"| {key} | {label} | {quiet:.1f} ms | {busy:.1f} ms | {growth:.2f}x | "
                     f"**{growth / ort_growth[key]:.2f}** |")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("busy_machine", text)


if __name__ == "__main__":
    main()
