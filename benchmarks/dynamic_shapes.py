"""A dynamic-shape transformer served many sequence lengths: correctness, the cost of a new
shape, and the memory each planned shape holds (issue 18's dynamic-shape bar).

A model of ``transformer_zoo.py`` (BERT-base by default, exported with symbolic batch and
sequence axes) is compiled once with no input shapes, then run at ``--lengths`` sequence
lengths in turn, each with one padded position; every output is compared with
onnxruntime's. Two passes, each with a fresh compiled model:

* **cold**: the build cache starts empty (a temporary one), so a new shape's kernels go
  through the C compiler;
* **warm**: the same lengths again with the kernels built: the cost a server pays for a
  length it has not planned in this process.

Per length: the planning cost of the new shape (``shape_stats()``'s compile seconds: load,
fold, plan, policy, kernel loads), its whole cost (the first run's time minus the second
run's: planning plus building the native program, weights packed where no other shape
packed them alike), a second run's latency, the error against onnxruntime, and the
process's resident memory after it. Threads: ``--threads`` for both
engines (spec cores and ``OMP_NUM_THREADS`` for tunecache, intra-op threads for
onnxruntime).

    python benchmarks/dynamic_shapes.py [--model bert_base_s128] [--threads 1]
        [--lengths 8,16,...] [--max-shapes 16] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

LENGTHS = (8, 16, 24, 32, 40, 48, 64, 80, 96, 100, 112, 128, 144, 160, 192, 200, 224, 256,
           320, 384)


@dataclass(frozen=True)
class Served:
    """One sequence length's first and second run in one pass."""

    length: int
    plan_s: float
    first_run_s: float
    run_s: float
    error: float
    rss_mib: float

    @property
    def new_shape_s(self) -> float:
        """What the first run cost beyond a run: planning, building the native program."""
        return self.first_run_s - self.run_s


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def feeds_for(template: dict[str, np.ndarray], length: int, seed: int) -> dict[str, np.ndarray]:
    """Token ids and a padding mask (first position padded) of ``length`` tokens."""
    rng = np.random.default_rng(seed)
    ids = template["input_ids"]
    feeds = {"input_ids": rng.integers(0, 1000, (ids.shape[0], length)).astype(ids.dtype)}
    mask = np.ones((ids.shape[0], length), template["attention_mask"].dtype)
    mask[0, 0] = 0
    feeds["attention_mask"] = mask
    return feeds


def serve(path: Path, template: dict[str, np.ndarray], lengths: list[int], threads: int,
          max_shapes: int, session: object, work: Path) -> tuple[list[Served], int]:
    from tunecache.cache.store import Store
    from tunecache.compiler.hardware import local_spec
    from tunecache.tuner.deploy import compile_model

    hw = replace(local_spec(), cores=threads)
    compiled = compile_model(path, store=Store(work), policy="analytic", record_wanted=False,
                             hw=hw, max_shapes=max_shapes)
    served = []
    for i, length in enumerate(lengths):
        feeds = feeds_for(template, length, seed=i)
        start = time.perf_counter()
        ours = compiled.run(feeds)
        first = time.perf_counter() - start
        start = time.perf_counter()
        compiled.run(feeds)
        again = time.perf_counter() - start
        stats = next(s for s in compiled.shape_stats()
                     if s.inputs["input_ids"][1] == length)
        theirs = session.run(None, feeds)  # type: ignore[attr-defined]
        name = next(iter(ours))
        error = float(np.abs(ours[name] - theirs[0]).max() / np.abs(theirs[0]).max())
        served.append(Served(length, stats.compile_s, first, again, error, rss_mib()))
        print(f"  seq {length:4d}: plan {stats.compile_s * 1e3:7.0f} ms, first run "
              f"{first * 1e3:7.0f} ms, run {again * 1e3:7.1f} ms, error {error:.1e}, "
              f"RSS {served[-1].rss_mib:.0f} MiB", flush=True)
    return served, compiled.evicted


def table(cold: list[Served], warm: list[Served]) -> str:
    rows = ["| sequence | new shape, cold: plan / whole | new shape, warm: plan / whole "
            "| run | rel. err (cold / warm) | RSS after (warm pass) |",
            "|---|---|---|---|---|---|"]
    for c, w in zip(cold, warm, strict=True):
        rows.append(f"| {c.length} | {c.plan_s * 1e3:.0f} / {c.new_shape_s * 1e3:.0f} ms | "
                    f"{w.plan_s * 1e3:.0f} / {w.new_shape_s * 1e3:.0f} ms | "
                    f"{w.run_s * 1e3:.1f} ms | {c.error:.1e} / {w.error:.1e} | "
                    f"{w.rss_mib:.0f} MiB |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert_base_s128",
                        help="a transformer_zoo.py key with input_ids and attention_mask")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--max-shapes", type=int, default=16)
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",") if x]
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    work = Path(tempfile.mkdtemp(prefix="tc-dynamic-"))
    os.environ["TUNECACHE_BUILD_CACHE"] = str(work / "kernels")  # the cold pass's empty cache

    import onnxruntime as ort
    import transformer_zoo
    from _report import git_revision, machine_summary, write_section

    if transformer_zoo.ZOO[args.model].images:
        raise SystemExit(f"error: --model {args.model} takes images; dynamic_shapes.py serves "
                         "sequence lengths (bert_*, gpt2_prefill, llama_small)")
    path, template = transformer_zoo.export(args.model, work)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    print(f"{args.model}: {len(lengths)} sequence lengths, {args.threads} thread(s)")
    try:  # the export, stores and kernels: gigabytes
        print("cold (empty build cache):")
        cold, _ = serve(path, template, lengths, args.threads, args.max_shapes, session,
                        work / "cold")
        print("warm (kernels built):")
        start_rss = rss_mib()
        warm, evicted = serve(path, template, lengths, args.threads, args.max_shapes, session,
                              work / "warm")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    plan = statistics.median(w.plan_s for w in warm)
    whole = statistics.median(w.new_shape_s for w in warm)
    worst = max(s.error for s in (*cold, *warm))
    growth = (warm[-1].rss_mib - warm[0].rss_mib) / max(1, min(len(warm), args.max_shapes) - 1)
    summary = (f"{len(lengths)} lengths ({lengths[0]}–{lengths[-1]}), every run within "
               f"{worst:.1e} of onnxruntime; a new shape, warm: median plan {plan * 1e3:.0f} ms, "
               f"median whole cost {whole * 1e3:.0f} ms (first run minus a run); cold: median "
               f"whole cost {statistics.median(c.new_shape_s for c in cold):.2f} s; resident memory "
               f"{growth:.0f} MiB more per planned shape (warm pass started at "
               f"{start_rss:.0f} MiB); {evicted} shape(s) evicted at max_shapes="
               f"{args.max_shapes}.")
    print(summary)
    if not args.no_write:
        text = (f"{machine_summary()}\n\nRevision `{git_revision()}`. Model `{args.model}` "
                f"(transformer_zoo.py), {args.threads} thread(s), policy analytic, an empty "
                f"store.\n\n{table(cold, warm)}\n\n{summary}")
        write_section(text)


if __name__ == "__main__":
    main()
