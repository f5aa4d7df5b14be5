"""Differential fuzzing against onnxruntime: thousands of small generated ONNX graphs.

Each case is a graph from ``tests/graph_fuzz.py`` (three in four valid, one in four with a
defect onnxruntime refuses; hypothesis may run out of distinct invalid ones first),
compiled with ``compile_model`` (analytic policy, a throwaway store, kernels built into
the usual build cache) and run, and run by onnxruntime. A valid graph agrees when the
outputs do (NaN where onnxruntime has NaN, the same infinities, finite values within the
derived float32 bound); an invalid one when tunecache refuses it with a TunecacheError.
Cases run one at a time in a worker process, each within ``--case-timeout`` seconds (a hung
or crashed worker is a disagreement, and a new worker takes the next case). Prints the
counts and every disagreement; writes docs/BENCHMARKS.md's section. Progress on stderr.

    python benchmarks/fuzz_onnxruntime.py [--cases 5000] [--seed 0] [--json out.json] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _pool import Failed, WorkerPool
from _report import git_revision, machine_summary, write_section
from graph_fuzz import FuzzCase, valid_cases
from graph_fuzz_invalid import invalid_cases
from graph_fuzz_judge import Outcome
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st


def _worker(conn: Connection, workdir: str) -> None:
    """Run the cases the parent sends, one at a time, answering each with its Outcome."""
    from graph_fuzz_judge import run_case

    from tunecache.cache.store import Store

    store = Store(Path(workdir) / "store")
    while True:
        case = conn.recv()
        if case is None:
            return
        conn.send(run_case(case, Path(workdir), store))


class Pool:
    """The worker pool (:mod:`_pool`) judging fuzz cases: a case it could not answer is a
    disagreement."""

    def __init__(self, timeout_s: float) -> None:
        self.pool = WorkerPool(_worker, timeout_s, prefix="tunecache-fuzz-")

    def run(self, case: FuzzCase) -> Outcome:
        start = time.perf_counter()
        answer = self.pool.ask(case)
        if not isinstance(answer, Failed):
            return cast(Outcome, answer)
        return Outcome(case.valid, "disagree", answer.detail, time.perf_counter() - start,
                       kinds=["timed out" if answer.timed_out else "worker died"])

    def close(self) -> None:
        self.pool.close()


@dataclass
class Tally:
    """Every case's outcome, in order, with its description."""

    rows: list[tuple[FuzzCase, Outcome]] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def add(self, case: FuzzCase, outcome: Outcome) -> None:
        self.rows.append((case, outcome))

    def count(self, valid: bool | None = None, verdict: str | None = None) -> int:
        return sum(1 for c, o in self.rows if (valid is None or c.valid == valid)
                   and (verdict is None or o.verdict == verdict))

    def disagreements(self) -> list[tuple[FuzzCase, Outcome]]:
        return [(c, o) for c, o in self.rows if o.verdict == "disagree"]


def run(cases: int, seed_value: int, timeout_s: float, max_steps: int) -> Tally:
    """Generate ``cases`` graphs from hypothesis seed ``seed_value`` (three in four valid,
    the rest invalid) and judge each."""
    tally = Tally()
    pool = Pool(timeout_s)
    invalid = cases // 4
    try:
        for strategy, count in ((valid_cases(max_steps=max_steps), cases - invalid),
                                (invalid_cases(), invalid)):
            _judge_all(strategy, count, seed_value, pool, tally, cases)
    finally:
        pool.close()
    return tally


def _judge_all(strategy: st.SearchStrategy[FuzzCase], count: int, seed_value: int, pool: Pool,
               tally: Tally, total: int) -> None:
    """Judge ``count`` examples of ``strategy`` (fewer if hypothesis runs out of new ones)."""

    @seed(seed_value)
    @settings(max_examples=count, database=None, deadline=None, derandomize=False,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(case: FuzzCase) -> None:
        outcome = pool.run(case)
        tally.add(case, outcome)
        if outcome.verdict == "disagree":
            print(f"disagreement {len(tally.disagreements())}: {case.describe()}\n"
                  f"    {outcome.detail}", flush=True)
        _progress(tally, total)

    if count:
        one()


def _progress(tally: Tally, total: int) -> None:
    done = len(tally.rows)
    if done % 25 and done != total:
        return
    elapsed = time.perf_counter() - tally.started
    print(f"[{done}/{total}] valid {tally.count(True)}, invalid {tally.count(False)}, "
          f"disagreements {len(tally.disagreements())}; {elapsed:.0f} s, "
          f"{elapsed / max(done, 1):.2f} s/case", file=sys.stderr, flush=True)


def _signature(case: FuzzCase, outcome: Outcome) -> str:
    """What a disagreement is about, for grouping: the kind of graph and what went wrong."""
    return f"{'valid' if case.valid else 'invalid'} graph: {', '.join(outcome.kinds)}"


def render(tally: Tally, args: argparse.Namespace) -> str:
    """The BENCHMARKS.md section: machine, revision, the counts, and the disagreements
    grouped by what differed, each group with its first case."""
    times = [o.seconds for _, o in tally.rows]
    wall = time.perf_counter() - tally.started
    lines = [machine_summary(), "",
             f"Revision `{git_revision()}`. {len(tally.rows)} generated graphs (hypothesis seed "
             f"{args.seed}; valid ones of up to {args.max_steps} steps over dims from a small "
             "vocabulary, a quarter of them with NaN, infinities or denormals in their inputs; "
             "invalid ones with one defect each), compiled (analytic policy, empty store) and "
             "run by tunecache, and run by onnxruntime (one thread, no graph optimisations); "
             f"at most {args.case_timeout:g} s per case. A valid graph agrees when NaN, "
             "infinities and finite values within the derived float32 bound match; an invalid "
             "one when tunecache refuses it with a TunecacheError.", "",
             "| cases | valid | invalid | agree | disagree | onnxruntime refused a valid graph "
             "| onnxruntime ran an invalid one | wall time | median ms/case |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| {len(tally.rows)} | {tally.count(True)} | {tally.count(False)} | "
             f"{tally.count(verdict='agree')} | {len(tally.disagreements())} | "
             f"{tally.count(True, 'ort-refused-valid')} | "
             f"{tally.count(False, 'ort-accepted-invalid')} | {wall / 60:.1f} min | "
             f"{1e3 * statistics.median(times) if times else 0:.0f} |", ""]
    groups: dict[str, list[tuple[FuzzCase, Outcome]]] = {}
    for case, outcome in tally.disagreements():
        groups.setdefault(_signature(case, outcome), []).append((case, outcome))
    if not groups:
        lines.append("No disagreements.")
    for signature, members in groups.items():
        case, outcome = members[0]
        common = set.intersection(*({n.op_type for n in c.model.graph.node} for c, _ in members))
        lines.append(f"- **{len(members)}x** {signature} (ops in every such graph: "
                     f"{', '.join(sorted(common)) or 'none'}). First: `{case.describe()}`: "
                     f"{outcome.detail}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=5000, help="graphs to try (default 5000)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument("--max-steps", type=int, default=4, help="steps per valid graph")
    parser.add_argument("--case-timeout", type=float, default=60.0,
                        help="seconds a case may take before its worker is killed")
    parser.add_argument("--json", type=Path, help="also write every case's outcome here")
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    args = parser.parse_args()
    tally = run(args.cases, args.seed, args.case_timeout, args.max_steps)
    text = render(tally, args)
    print(text)
    verdicts = Counter(o.verdict for _, o in tally.rows)
    print(f"verdicts: {dict(verdicts)}", file=sys.stderr)
    if not args.no_write:
        write_section(text)
    if args.json:
        args.json.write_text(json.dumps([{
            "index": i, "valid": c.valid, "verdict": o.verdict, "detail": o.detail,
            "seconds": o.seconds, "case": c.describe(), "kinds": o.kinds,
        } for i, (c, o) in enumerate(tally.rows)], indent=2))


if __name__ == "__main__":
    main()
