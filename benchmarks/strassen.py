"""Strassen (``strassen=1`` and ``2`` levels) against the BLIS kernel on transformer projections.

For each matmul (BERT-base's four projections and GPT-2's LM head at sequence 128, BERT's
FFN up-projection at batch 8) and thread count, the tiler's best ``--top`` schedules of each
kind (by the analytic estimate) are timed as the tuner times them: built, checked against
the reference, constant weights packed once and rotated past twice the L3 so every call
streams them from memory, as a model's do. Rounds interleave the kinds (no Strassen, one
level, two levels where the tiler proposes them) and numpy (OpenBLAS, its weights as cold);
each figure is the median over rounds of the best schedule's median. Ratio = Strassen ÷ BLIS
kernel (below 1: Strassen is faster).

    python benchmarks/strassen.py [--threads 1,2] [--rounds 3] [--top 3]
"""

from __future__ import annotations

import argparse
import statistics

from _report import git_revision, machine_summary, write_section

from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule
from tunecache.tuner.measure.runner import Candidate, Runner
from tunecache.tuner.search.roller import candidates

HW = local_spec()
OPS = [
    ("GPT-2 QKV", matmul_op(128, 2304, 768, epilogue="bias")),
    ("BERT-base Q, K, V and out", matmul_op(128, 768, 768, epilogue="bias")),
    ("BERT-base FFN up", matmul_op(128, 3072, 768, epilogue="bias+gelu_erf")),
    ("BERT-base FFN down", matmul_op(128, 768, 3072, epilogue="bias")),
    ("GPT-2 LM head", matmul_op(128, 50257, 768, trans_b=True)),
    ("BERT-base FFN up, batch 8", matmul_op(1024, 3072, 768, epilogue="bias+gelu_erf")),
]
LEVELS = (0, 1, 2)
Row = tuple[str, int, dict[int, float], float, str]
"""op label, threads, best seconds per Strassen level measured, numpy s, the fastest
Strassen schedule."""


def best_of_each(op: OpSignature, threads: int, top: int) -> dict[int, list[Schedule]]:
    """The tiler's first ``top`` schedules of each Strassen level it proposes."""
    pool = candidates(op, HW, k=400, threads=threads)
    chosen = {level: [c.schedule for c in pool
                      if getattr(c.schedule, "strassen", 0) == level][:top]
              for level in LEVELS}
    return {level: found for level, found in chosen.items() if found}


def measure(runner: Runner, op: OpSignature, threads: int,
            schedules: dict[int, list[Schedule]], rounds: int
            ) -> tuple[dict[int, float], float, str]:
    """Median over rounds of each level's best median, numpy's median, the fastest Strassen
    schedule (most often over rounds)."""
    best: dict[int, list[float]] = {level: [] for level in schedules}
    numpy: list[float] = []
    wins: dict[str, int] = {}
    for _ in range(rounds):
        fastest_strassen = None
        for level, chosen in schedules.items():
            results = runner.measure([Candidate(op, s) for s in chosen])
            bad = [r for r in results if not r.ok]
            if bad:
                raise SystemExit(f"error: {op.text} {bad[0].schedule}: {bad[0].error}")
            fastest = min(results, key=lambda r: r.median_s or float("inf"))
            best[level].append(float(fastest.median_s or 0.0))
            if level and (fastest_strassen is None
                          or (fastest.median_s or 0.0) < (fastest_strassen.median_s or 0.0)):
                fastest_strassen = fastest
        if fastest_strassen is not None:
            key = str(fastest_strassen.schedule)
            wins[key] = wins.get(key, 0) + 1
        baseline = runner.measure_numpy(op, threads)
        numpy.append(float(baseline.median_s or float("nan")))
    return ({level: statistics.median(times) for level, times in best.items()},
            statistics.median(numpy), max(wins, key=lambda k: wins[k]) if wins else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--only", help="substring of the op labels to keep")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows: list[Row] = []
    with Runner(HW) as runner:
        for threads in (int(t) for t in args.threads.split(",")):
            if threads > HW.cores:
                continue
            for label, op in OPS:
                if args.only and args.only not in label:
                    continue
                chosen = best_of_each(op, threads, args.top)
                times, numpy, sched = measure(runner, op, threads, chosen, args.rounds)
                rows.append((label, threads, times, numpy, sched))
                levels = "  ".join(f"strassen{level} {t * 1e3:8.3f} ms ({t / times[0]:.3f})"
                                   for level, t in times.items() if level)
                print(f"{label:28} t{threads}  BLIS {times[0] * 1e3:8.3f} ms  {levels}  "
                      f"numpy {numpy * 1e3:8.3f} ms  {sched}", flush=True)
    if not args.no_write and rows:
        write_section(render(rows, args))
    return 0


def render(rows: list[Row], args: argparse.Namespace) -> str:
    lines = [machine_summary(),
             f"Revision `{git_revision()}`.",
             "",
             f"Per op and thread count, the tiler's first {args.top} schedules of each "
             "Strassen level it proposes (0: the BLIS kernel; 2 only where every dimension is "
             "at least 128), timed as the tuner times them (checked; weights packed once and "
             f"streamed from memory); medians over {args.rounds} interleaved rounds of each "
             "level's fastest. Ratios ÷ the BLIS kernel; ÷ numpy = the faster Strassen level "
             "÷ numpy (OpenBLAS, weights as cold; its GELU is scipy's erf, hence the FFN up "
             "rows).",
             "",
             "| op | shape | threads | BLIS kernel | one level | ratio | two levels | ratio | "
             "numpy | ÷ numpy | fastest Strassen schedule |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    shapes = dict(OPS)
    for label, threads, times, numpy, sched in rows:
        d = shapes[label].dims_dict
        cells = []
        for level in (1, 2):
            t = times.get(level)
            cells += ["—", "—"] if t is None else [f"{t * 1e3:.3f} ms",
                                                   f"**{t / times[0]:.3f}**"]
        fast = min(t for level, t in times.items() if level)
        lines.append(f"| {label} | {d['M']}x{d['N']}x{d['K']} | {threads} | "
                     f"{times[0] * 1e3:.3f} ms | {' | '.join(cells)} | "
                     f"{numpy * 1e3:.3f} ms | {fast / numpy:.2f} | `{sched}` |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
