"""ONNX's backend node tests, all of them, through tunecache and through onnxruntime.

Every test the installed ``onnx`` generates (``tests/onnx_conformance.py`` says how each is
run and judged: match, wrong, refused, crash) runs in a worker process, one at a time, each
within ``--case-timeout`` seconds (a test that kills or hangs the worker counts as a crash,
and a new worker takes the next). onnxruntime runs the same tests in its own worker. Prints
the totals, every wrong answer and crash, and the tests whose verdict disagrees with
``tests/data/onnx_conformance_expected.txt`` (a listed test that now matches, an unlisted
one that does not); writes docs/BENCHMARKS.md's section with the per-op table. Progress on
stderr.

    python benchmarks/onnx_conformance.py [--only PREFIX] [--engines tunecache,onnxruntime]
        [--case-timeout 120] [--json out.json] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _pool import Failed, WorkerPool
from _report import git_revision, machine_summary, write_section
from onnx_conformance import Verdict, is_float, node_cases, op_of, read_expected, run_case

ENGINES = ("tunecache", "onnxruntime")


def _worker(conn: Connection, workdir: str) -> None:
    """Answer ``(engine, test name)`` requests with the test's :class:`Verdict`."""
    cases = node_cases()
    while True:
        request = conn.recv()
        if request is None:
            return
        engine, name = request
        conn.send(run_case(cases[name], engine, Path(workdir) / "store"))


def judge_all(names: Sequence[str], engines: Sequence[str], timeout_s: float
              ) -> dict[str, dict[str, Verdict]]:
    """Per engine, every test's verdict."""
    cases = node_cases()
    out: dict[str, dict[str, Verdict]] = {}
    for engine in engines:
        pool = WorkerPool(_worker, timeout_s, prefix="tunecache-conformance-")
        start, verdicts = time.perf_counter(), {}
        try:
            pool.ask((engine, names[0]), timeout_s=max(timeout_s, 120))  # warm up: collect
            for i, name in enumerate(names, 1):
                answer = pool.ask((engine, name))
                verdicts[name] = answer if isinstance(answer, Verdict) else Verdict(
                    name, op_of(cases[name]), "crash", answer.detail
                    if isinstance(answer, Failed) else repr(answer))
                if i % 50 == 0 or i == len(names):
                    tally = Counter(v.verdict for v in verdicts.values())
                    print(f"[{engine} {i}/{len(names)}] {dict(tally)}; "
                          f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        finally:
            pool.close()
        out[engine] = verdicts
    return out


def _score(verdicts: dict[str, Verdict], names: Sequence[str]) -> str:
    matched = sum(verdicts[n].verdict == "match" for n in names)
    return f"{matched} / {len(names)} ({100 * matched / max(len(names), 1):.1f}%)"


def _op_table(results: dict[str, dict[str, Verdict]], names: Sequence[str]) -> list[str]:
    """Per op that tunecache does not match on every test: each engine's count and ours'
    verdicts; the ops it matches fully are counted in one line (their counts for the other
    engines are in the totals)."""
    cases = node_cases()
    ops: dict[str, list[str]] = {}
    for name in names:
        ops.setdefault(op_of(cases[name]), []).append(name)
    engines = list(results)
    ours = results.get("tunecache", {})
    rows = []
    for op in sorted(ops):
        tests = ops[op]
        counts = [sum(results[e][t].verdict == "match" for t in tests) for e in engines]
        if (counts[engines.index("tunecache")] if ours else min(counts)) == len(tests):
            continue
        missed = Counter(ours[t].verdict for t in tests if ours and ours[t].verdict != "match")
        rows.append(f"| {op} | {len(tests)} | " + " | ".join(map(str, counts)) + " | "
                    + (", ".join(f"{v}: {c}" for v, c in sorted(missed.items())) or "-")
                    + " |")
    full = len(ops) - len(rows)
    return [f"{full} of {len(ops)} ops: every test matched by tunecache. The others:", "",
            "| op | tests | " + " | ".join(f"{e} match" for e in engines)
            + " | tunecache: not matched (verdict: tests) |",
            "|---|---|" + "---|" * len(engines) + "---|", *rows]


def render(results: dict[str, dict[str, Verdict]], names: Sequence[str], wall_s: float) -> str:
    """The BENCHMARKS.md section: machine, revision, scores, failures, the per-op table."""
    import onnx

    cases = node_cases()
    floats = [n for n in names if is_float(cases[n])]
    lines = [machine_summary(), "",
             f"Revision `{git_revision()}`, onnx {onnx.__version__}; {wall_s / 60:.1f} min. "
             "Each of onnx's backend node tests compiled (analytic "
             "policy, empty store) and run by tunecache, and run by onnxruntime (one thread); "
             "a test matches when every output has the expected dtype and shape and values "
             "within the test's rtol/atol. Float tests: every output a float tensor.", "",
             "| engine | all tests match | float tests match | wrong | refused | crash |",
             "|---|---|---|---|---|---|"]
    for engine, verdicts in results.items():
        tally = Counter(v.verdict for v in verdicts.values())
        lines.append(f"| {engine} | {_score(verdicts, names)} | {_score(verdicts, floats)} | "
                     f"{tally['wrong']} | {tally['refused']} | {tally['crash']} |")
    ours = results.get("tunecache", {})
    bad = [v for v in ours.values() if v.verdict in ("wrong", "crash")]
    lines += ["", f"tunecache's wrong answers and crashes: {len(bad) or 'none'}."]
    lines += [f"* `{v.name}` ({v.op}, {v.verdict}): {v.why}" for v in bad]
    return "\n".join([*lines, "", *_op_table(results, names)])


def expectation_drift(ours: dict[str, Verdict]) -> list[str]:
    """Tests whose verdict disagrees with the expected-failures file."""
    expected = read_expected()
    out = []
    for name, verdict in sorted(ours.items()):
        if name in expected and verdict.verdict == "match":
            out.append(f"{name}: listed as failing ({expected[name]}) but matches now")
        elif name not in expected and verdict.verdict != "match":
            out.append(f"{name}: {verdict.verdict}, not listed: {verdict.why}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--only", default="", help="run the tests whose name starts so")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--case-timeout", type=float, default=120.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    if any(e not in ENGINES for e in engines):
        print(f"error: --engines takes {', '.join(ENGINES)}", file=sys.stderr)
        return 2
    names = sorted(n for n in node_cases() if n.startswith(args.only))
    if not names:
        print(f"error: no backend node test starts with {args.only!r}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    results = judge_all(names, engines, args.case_timeout)
    markdown = render(results, names, time.perf_counter() - start)
    print(markdown)
    if "tunecache" in results:
        drift = expectation_drift(results["tunecache"])
        print(f"\nexpected-failures file: {len(drift)} test(s) disagree with it")
        print("\n".join(drift))
    if args.json:
        args.json.write_text(json.dumps({e: {n: v.__dict__ for n, v in r.items()}
                                         for e, r in results.items()}, indent=1))
    if not args.no_write and not args.only:
        write_section(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
