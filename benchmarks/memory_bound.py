"""Memory-bound op kinds (softmax, layernorm, pool2d, elementwise) against numpy.

For every shape and thread count, the tiler's top candidates are built and timed and the
fastest is compared with the kind's numpy reference on float32 inputs, timed in the same run
in its own worker process at the same thread count (numpy's element-wise code is
single-threaded whatever the count). Achieved bandwidth is the op's minimum bytes (every
tensor read or written once) over the kernel's median time, against the machine's memory
bandwidth measured in the same run with a STREAM-style copy (bytes read + written, the
better of plain and streaming stores). Results are printed and written to docs/BENCHMARKS.md.

    python benchmarks/memory_bound.py [--threads 1 2] [--top 6] [--kinds softmax ...] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_revision, machine_summary, write_section

from tunecache.compiler.backends import backend_for
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.ops import OpSignature
from tunecache.tuner.measure import Candidate, MeasureResult, Runner, TimingConfig, best
from tunecache.tuner.search.roller import candidates

P = OpSignature.parse
# (kind, label, op): BERT-base / GPT-2 / Llama and ResNet-50 / MobileNet-v2 shapes at batch 1,
# and large ones whose tensors are far beyond the last-level cache.
SHAPES: list[tuple[str, str, OpSignature]] = [
    ("softmax", "BERT-base attention, seq 128 (12 heads, padding mask)",
     P("softmax(M=1536,N=128,mask_rows=1,scale=yes)")),
    ("softmax", "BERT-base attention, seq 384", P("softmax(M=4608,N=384,mask_rows=1,scale=yes)")),
    ("softmax", "GPT-2 causal attention, seq 128", P("softmax(M=1536,N=128,Q=128,causal=yes)")),
    ("softmax", "GPT-2 LM head, 128 tokens x 50257", P("softmax(M=128,N=50257)")),
    ("layernorm", "BERT-base, seq 128", P("layernorm(M=128,N=768)")),
    ("layernorm", "BERT-base, seq 384, residual", P("layernorm(M=384,N=768,residual=yes)")),
    ("layernorm", "Llama RMSNorm, 128 x 4096", P("layernorm(M=128,N=4096,norm=rms,affine=gamma)")),
    ("layernorm", "4096 x 4096", P("layernorm(M=4096,N=4096)")),
    ("pool2d", "ResNet-50 max pool 3x3/2", P(
        "pool2d(N=1,C=64,H=112,W=112,R=3,S=3,stride_h=2,stride_w=2,pad_t=1,pad_l=1,pad_b=1,"
        "pad_r=1,mode=max)")),
    ("pool2d", "ResNet-50 global average 7x7", P("pool2d(N=1,C=2048,H=7,W=7,R=7,S=7,mode=avg)")),
    ("pool2d", "MobileNet-v2 global average 7x7", P("pool2d(N=1,C=1280,H=7,W=7,R=7,S=7,mode=avg)")),
    ("pool2d", "max pool 3x3/2, batch 16", P(
        "pool2d(N=16,C=64,H=112,W=112,R=3,S=3,stride_h=2,stride_w=2,pad_t=1,pad_l=1,pad_b=1,"
        "pad_r=1,mode=max)")),
    ("pool2d", "global average 28x28, 256 channels, batch 64",
     P("pool2d(N=64,C=256,H=28,W=28,R=28,S=28,mode=avg)")),
    ("elementwise", "ResNet-50 residual add + relu (256x56x56)",
     P("elementwise(M=256,N=3136,operand=full,epilogue=add+relu)")),
    ("elementwise", "BERT-base GELU (128x3072)", P("elementwise(M=128,N=3072,epilogue=gelu_erf)")),
    ("elementwise", "bias + SiLU (128x11008)",
     P("elementwise(M=128,N=11008,operand=row,epilogue=add+silu)")),
    ("elementwise", "add, 4096x4096", P("elementwise(M=4096,N=4096,operand=full,epilogue=add)")),
    ("elementwise", "relu, 4096x4096", P("elementwise(M=4096,N=4096,epilogue=relu)")),
]


@dataclass
class Row:
    kind: str
    label: str
    op: OpSignature
    threads: int
    kernel: MeasureResult | None
    numpy_s: float | None
    misses_cache: bool

    @property
    def speedup(self) -> float | None:
        if self.kernel is None or not self.kernel.median_s or not self.numpy_s:
            return None
        return self.numpy_s / self.kernel.median_s

    @property
    def gbs(self) -> float | None:
        if self.kernel is None or not self.kernel.median_s:
            return None
        return self.op.min_bytes / self.kernel.median_s / 1e9


def run(threads_list: list[int], timing: TimingConfig, top: int,
        kinds: set[str] | None) -> tuple[list[Row], dict[int, float]]:
    hw = local_spec()
    shapes = [s for s in SHAPES if kinds is None or s[0] in kinds]
    bandwidth = {t: backend_for(hw).bandwidth_gbs(hw, t) for t in threads_list}
    print("memory bandwidth (copy, GB/s): " + ", ".join(
        f"{t}T {b:.1f}" for t, b in bandwidth.items()), flush=True)
    rows: list[Row] = []
    with Runner(hw, timing) as runner:
        for threads in threads_list:
            for kind, label, op in shapes:
                pool = candidates(op, hw, k=top, threads=threads)
                results = runner.measure([Candidate(op, c.schedule, source="tiler",
                                                    predicted=c.estimate.seconds) for c in pool])
                numpy = [runner.measure_numpy(op, threads) for _ in range(2)]
                numpy_s = min((r.median_s for r in numpy if r.ok and r.median_s), default=None)
                misses = op.min_bytes > hw.l3_bytes
                row = Row(kind, label, op, threads, best(results), numpy_s, misses)
                rows.append(row)
                k = row.kernel
                print(f"[{threads}T] {kind:<11} {label:<46} ours {_us(k.median_s if k else None)} "
                      f"numpy {_us(numpy_s)} speedup {_x(row.speedup)} "
                      f"{_f(row.gbs)} GB/s {'(misses cache)' if misses else ''}", flush=True)
    return rows, bandwidth


def _us(s: float | None) -> str:
    return f"{s * 1e6:9.1f} us" if s else "      n/a"


def _x(x: float | None) -> str:
    return f"{x:.2f}x" if x else "n/a"


def _f(x: float | None) -> str:
    return f"{x:.1f}" if x else "n/a"


def render(rows: list[Row], bandwidth: dict[int, float], timing: TimingConfig, top: int) -> str:
    lines = [machine_summary(), "", f"Revision `{git_revision()}`. Ours: the fastest of the "
             f"tiler's top {top} candidates; numpy: the kind's reference on float32 inputs "
             f"(best of two timings); both medians of ≥ {timing.min_repeats} repeats and "
             f"≥ {timing.min_time_s:g} s, in separate worker processes, same thread count. "
             "Bandwidth: the op's minimum bytes (each tensor read or written once) over our "
             "median time; the machine's, measured in this run by a STREAM-style copy (bytes "
             "read + written): " + ", ".join(f"{t} thread(s) {b:.1f} GB/s"
                                              for t, b in bandwidth.items()) + ".", ""]
    lines.append("| kind | shape | op | threads | ours µs | numpy µs | speedup | GB/s | "
                 "% of bandwidth | best schedule |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        k = r.kernel
        pct = f"{100 * r.gbs / bandwidth[r.threads]:.0f}%" if r.gbs else "n/a"
        if not r.misses_cache:
            pct += " (in cache)"
        lines.append(
            f"| {r.kind} | {r.label} | `{r.op.text}` | {r.threads} | "
            f"{_us(k.median_s if k else None).strip()} | {_us(r.numpy_s).strip()} | "
            f"{_x(r.speedup)} | {_f(r.gbs)} | {pct} | `{k.schedule if k else '-'}` |")
    lines.append("")
    for threads in sorted(bandwidth):
        for kind in dict.fromkeys(r.kind for r in rows):
            mine = [r for r in rows if r.threads == threads and r.kind == kind]
            speed = [r.speedup for r in mine if r.speedup]
            big = [100 * r.gbs / bandwidth[threads] for r in mine if r.gbs and r.misses_cache]
            if speed:
                text = (f"- {threads} thread(s), {kind}: median speedup over numpy "
                        f"**{statistics.median(speed):.2f}x** (min {min(speed):.2f}x)")
                if big:
                    text += (f"; shapes that miss the cache reach "
                             f"{', '.join(f'{b:.0f}%' for b in big)} of the measured bandwidth")
                lines.append(text + ".")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--top", type=int, default=6, help="tiler candidates measured per op")
    parser.add_argument("--kinds", nargs="+", help="only these kinds")
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    parser.add_argument("--json", type=Path, help="also write raw rows as JSON here")
    args = parser.parse_args()
    timing = TimingConfig(min_time_s=args.min_time)
    rows, bandwidth = run(args.threads, timing, args.top, set(args.kinds) if args.kinds else None)
    text = render(rows, bandwidth, timing, args.top)
    print(text)
    if not args.no_write:
        write_section(text)
    if args.json:
        args.json.write_text(json.dumps([{
            "kind": r.kind, "label": r.label, "op": r.op.text, "threads": r.threads,
            "ours_s": r.kernel.median_s if r.kernel else None, "numpy_s": r.numpy_s,
            "speedup": r.speedup, "gbs": r.gbs, "misses_cache": r.misses_cache,
            "schedule": r.kernel.schedule.to_json() if r.kernel and r.kernel.schedule else None,
        } for r in rows], indent=2))


if __name__ == "__main__":
    main()
