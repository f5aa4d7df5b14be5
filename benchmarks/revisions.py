"""Two revisions of tunecache back to back: a compiled model's latency at a base revision and
at the working tree, each run in its own process, alternating in lockstep rounds, one
pinned core, one thread; the ratio per round (this tree ÷ base) and its median.

The base revision is checked out into a temporary git worktree and imported through a tree
of ``tunecache.<component>`` links placed first on ``PYTHONPATH`` (the editable install
keeps serving this tree to the other process). Both compile untuned (``analytic`` policy)
into a fresh store; kernels come from the shared build cache, so a refactor that leaves the
generated code alone compares runtimes alone.

    python benchmarks/revisions.py --base 528b26e [--rounds 5] [--runs 200] [--core 1]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_revision, machine_summary, write_section

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = ("compiler", "tuner", "costmodel", "cache", "datasets")
MODELS = {"mobilenet_v2": "mobilenet_v2_model()",
          "bert_layer_h256_s128": "bert_layer_model(batch=1, seq=128, hidden=256, heads=4)"}

_TIMER = """
import json, statistics, sys, tempfile, time
sys.path.insert(0, {tests!r})
import onnx
from onnx_support import bert_layer_model, mobilenet_v2_model, random_feeds
import tunecache.compiler
from tunecache.cache.store import Store
from tunecache.tuner.deploy import compile_model
model = {model}
with tempfile.TemporaryDirectory() as d:
    onnx.save(model, d + "/m.onnx")
    compiled = compile_model(d + "/m.onnx", store=Store(d + "/store"), policy="analytic",
                             record_wanted=False, threads=1)
    feeds = random_feeds(model)
    for _ in range(20):
        compiled.run(feeds)
    samples = []
    for _ in range({runs}):
        t = time.perf_counter(); compiled.run(feeds); samples.append(time.perf_counter() - t)
print(json.dumps([tunecache.compiler.__file__, statistics.median(samples) * 1e3]))
"""


def _base_tree(base: str, folder: Path) -> Path:
    """A ``tunecache`` import tree of revision ``base`` under ``folder``."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f",
                    str(folder / "checkout"), base], check=True, capture_output=True)
    tree = folder / "packages"
    (tree / "tunecache").mkdir(parents=True)
    for component in COMPONENTS:
        (tree / "tunecache" / component).symlink_to(folder / "checkout" / component)
    return tree


def _time(model: str, runs: int, core: int, pythonpath: Path | None) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    code = _TIMER.format(tests=str(ROOT / "tests"), model=MODELS[model], runs=runs)
    done = subprocess.run(["taskset", "-c", str(core), sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, check=True)
    loaded, ms = json.loads(done.stdout.strip().splitlines()[-1])
    expected = pythonpath if pythonpath is not None else ROOT
    if not str(Path(loaded).resolve()).startswith(str(expected.resolve())) and \
            not loaded.startswith(str(expected)):
        raise SystemExit(f"the run meant for {expected} imported {loaded}")
    return float(ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the revision to compare against")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--core", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tree = _base_tree(args.base, Path(folder))
        try:
            rows = []
            for model in MODELS:
                pairs = [(_time(model, args.runs, args.core, tree),
                          _time(model, args.runs, args.core, None)) for _ in range(args.rounds)]
                ratios = [new / old for old, new in pairs]
                rows.append((model, statistics.median(o for o, _ in pairs),
                             statistics.median(n for _, n in pairs), statistics.median(ratios),
                             ratios))
                print(f"{model}: base {rows[-1][1]:.3f} ms, tree {rows[-1][2]:.3f} ms, ratio "
                      f"{rows[-1][3]:.3f} ({', '.join(f'{r:.3f}' for r in ratios)})", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(Path(folder) / "checkout")], capture_output=True)
    table = ["| model | base (ms) | this tree (ms) | ratio, median of rounds | per round |",
             "|---|---|---|---|---|"]
    table += [f"| {m} | {o:.3f} | {n:.3f} | {r:.3f} | {', '.join(f'{x:.3f}' for x in rs)} |"
              for m, o, n, r, rs in rows]
    text = (f"{machine_summary()}\nRevision {git_revision()} (working tree) against "
            f"{args.base}; {args.rounds} lockstep rounds of {args.runs} runs, one thread, core "
            f"{args.core}.\n\n" + "\n".join(table))
    if not args.no_write:
        write_section(text)


if __name__ == "__main__":
    main()
