"""One level of Strassen (``strassen=1``) against the BLIS kernel on transformer projections.

For each matmul (BERT-base's four projections and GPT-2's LM head at sequence 128, BERT's
FFN up-projection at batch 8) and thread count, the tiler's best ``--top`` schedules of each
kind (by the analytic estimate) are timed as the tuner times them: built, checked against
the reference, constant weights packed once and rotated past twice the L3 so every call
streams them from memory, as a model's do. Rounds interleave the two kinds and numpy
(OpenBLAS, its weights as cold); each figure is the median over rounds of the best schedule's
median. Ratio = strassen ÷ BLIS kernel (below 1: Strassen is faster).

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
Row = tuple[str, int, float, float, float, str]
"""op label, threads, BLIS s, strassen s, numpy s, the strassen schedule."""


def best_of_each(op: OpSignature, threads: int, top: int) -> dict[int, list[Schedule]]:
    """The tiler's first ``top`` schedules without and with Strassen."""
    pool = candidates(op, HW, k=400, threads=threads)
    return {flag: [c.schedule for c in pool if c.schedule.strassen == flag][:top]
            for flag in (0, 1)}


def measure(runner: Runner, op: OpSignature, threads: int,
            schedules: dict[int, list[Schedule]], rounds: int) -> tuple[float, float, float, str]:
    """Median over rounds of each kind's best median, numpy's median, the best strassen."""
    best: dict[int, list[float]] = {0: [], 1: []}
    numpy: list[float] = []
    wins: dict[str, int] = {}
    for _ in range(rounds):
        for flag in (0, 1):
            results = runner.measure([Candidate(op, s) for s in schedules[flag]])
            bad = [r for r in results if not r.ok]
            if bad:
                raise SystemExit(f"error: {op.text} {bad[0].schedule}: {bad[0].error}")
            fastest = min(results, key=lambda r: r.median_s or float("inf"))
            best[flag].append(float(fastest.median_s or 0.0))
            if flag:
                wins[str(fastest.schedule)] = wins.get(str(fastest.schedule), 0) + 1
        baseline = runner.measure_numpy(op, threads)
        numpy.append(float(baseline.median_s or float("nan")))
    return (statistics.median(best[0]), statistics.median(best[1]), statistics.median(numpy),
            max(wins, key=lambda k: wins[k]))


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
                blis, fast, numpy, sched = measure(runner, op, threads, chosen, args.rounds)
                rows.append((label, threads, blis, fast, numpy, sched))
                print(f"{label:28} t{threads}  BLIS {blis * 1e3:8.3f} ms  strassen "
                      f"{fast * 1e3:8.3f} ms ({fast / blis:.3f})  numpy {numpy * 1e3:8.3f} ms  "
                      f"{sched}", flush=True)
    if not args.no_write and rows:
        write_section("strassen", render(rows, args))
    return 0


def render(rows: list[Row], args: argparse.Namespace) -> str:
    lines = [machine_summary(),
             f"Revision `{git_revision()}`.",
             "",
             f"Per op and thread count, the tiler's first {args.top} schedules of each kind, "
             "timed as the tuner times them (checked; weights packed once and streamed from "
             f"memory); medians over {args.rounds} interleaved rounds of each kind's fastest. "
             "Ratio = strassen ÷ BLIS kernel; ÷ numpy = strassen ÷ numpy (OpenBLAS, weights "
             "as cold; its GELU is scipy's erf, hence the FFN up rows).",
             "",
             "| op | shape | threads | BLIS kernel | strassen | ratio | numpy | ÷ numpy | "
             "strassen schedule |",
             "|---|---|---|---|---|---|---|---|---|"]
    shapes = dict(OPS)
    for label, threads, blis, fast, numpy, sched in rows:
        d = shapes[label].dims_dict
        lines.append(f"| {label} | {d['M']}x{d['N']}x{d['K']} | {threads} | "
                     f"{blis * 1e3:.3f} ms | {fast * 1e3:.3f} ms | **{fast / blis:.3f}** | "
                     f"{numpy * 1e3:.3f} ms | {fast / numpy:.2f} | `{sched}` |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
