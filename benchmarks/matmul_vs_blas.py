"""Generated matmul kernels against numpy (OpenBLAS) on model GEMMs and large squares.

For every shape and thread count, a small hand-picked schedule set (BLIS-style tiles and
blocks, no search) is built and timed, and the best is compared with numpy's ``matmul`` at
the same thread count, timed in the same worker process in the same run (numpy timed before
and after the candidates; its better figure is used). Fractions of the measured FMA peak are
reported too. Results are printed and written to docs/BENCHMARKS.md.

    python benchmarks/matmul_vs_blas.py [--threads 1 2] [--min-time 0.3] [--no-write]
        [--section avx2]   # a block of the script's section, one per ISA level
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
from tunecache.compiler.hardware import HardwareSpec, local_spec
from tunecache.compiler.kinds.batch_matmul import batch_matmul_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import problems
from tunecache.tuner.measure import Candidate, MeasureResult, Runner, TimingConfig, best

MM, BMM = matmul_op, batch_matmul_op
# BERT-base encoder layer at sequence length 128, batch 1, and ResNet-50's classifier.
MODEL_SHAPES = [
    ("BERT QKV / attention-out projection", MM(128, 768, 768, epilogue="bias")),
    ("BERT attention scores Q·Kᵀ (12 heads)", BMM(12, 128, 128, 64, trans_b=True)),
    ("BERT attention context P·V (12 heads)", BMM(12, 128, 64, 128)),
    ("BERT FFN up (768→3072)", MM(128, 3072, 768, epilogue="bias")),
    ("BERT FFN down (3072→768)", MM(128, 768, 3072, epilogue="bias")),
    ("ResNet-50 fc (2048→1000, Gemm transB)", MM(1, 1000, 2048, trans_b=True, epilogue="bias")),
]
SQUARES = [(f"square {n}", MM(n, n, n)) for n in (512, 1024, 2048)]


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def hand_picked(op: OpSignature, hw: HardwareSpec, threads: int) -> list[MatmulSchedule]:
    """A dozen-odd BLIS-style schedules: register tiles x K blocks x packing x split axis."""
    d = op.dims_dict
    M, N, K = d["M"], d["N"], d["K"]
    L = hw.lanes
    tiles = {"avx512": [(14, 2 * L), (6, 4 * L), (8, 3 * L), (8, 2 * L)],
             "avx2": [(6, 2 * L), (4, 3 * L)]}.get(hw.isa, [(6, 2 * L)])
    if M <= 16:
        tiles = [(min(M, 4), 4 * L), (1, 8 * L), *tiles[:1]]
    kcs = sorted({min(k, K) for k in (256, 512)} | ({K} if K <= 1024 else set()))
    packs_b = [1, 0] if (M <= 64 and not op.trans_b) else [1]
    if op.kind == "batch_matmul":
        pars = ["batch"] if threads > 1 else ["m"]
    else:
        pars = ["m", "n"] if threads > 1 else ["m"]
    out: list[MatmulSchedule] = []
    for mr, nr in tiles:
        for kc in kcs:
            for pack_b in packs_b:
                for par in pars:
                    split = threads if par == "m" else 1
                    mc = min(_round_up(max(1, (hw.l2_bytes // 2) // (kc * 4)), mr),
                             _round_up(-(-M // split), mr))
                    mc = max(mr, mc // mr * mr)
                    nc = min(_round_up(N, nr), max(nr, 4096 // nr * nr))
                    s = MatmulSchedule(mr=mr, nr=nr, kc=kc, mc=mc, nc=nc, pack_a=1,
                                       pack_b=pack_b, threads=threads, parallel=par)
                    if not problems(op, s, hw) and s not in out:
                        out.append(s)
    if op.attr("layout") == "nt" and M <= 16:
        # Matrix-vector products with transposed weights: dot products along K, no packing.
        for nv in (2, 4, 8):
            for par in (["n"] if threads > 1 else ["m"]):
                s = MatmulSchedule(mr=1, nr=nv * L, kc=min(K, 512), mc=1,
                                   nc=_round_up(N, nv * L), pack_a=0, pack_b=0,
                                   loop_order="dot", threads=threads, parallel=par)
                if not problems(op, s, hw):
                    out.append(s)
    return out


@dataclass
class Row:
    label: str
    group: str
    op: OpSignature
    threads: int
    kernel: MeasureResult | None
    numpy_gflops: float | None
    candidates: int
    ok: int

    @property
    def ratio(self) -> float | None:
        if self.kernel is None or not self.kernel.gflops or not self.numpy_gflops:
            return None
        return self.kernel.gflops / self.numpy_gflops


def run(threads_list: list[int], timing: TimingConfig, quick: bool) -> tuple[list[Row], dict]:
    hw = local_spec()
    shapes = [(label, op, "model") for label, op in MODEL_SHAPES]
    shapes += [(label, op, "square") for label, op in SQUARES]
    if quick:
        shapes = [s for s in shapes if s[1].flops < 2 * 2048**3]
    peaks = {t: backend_for(hw).peak_gflops(hw, t) for t in threads_list}
    rows: list[Row] = []
    with Runner(hw, timing) as runner:
        for threads in threads_list:
            for label, op, group in shapes:
                before = runner.measure_numpy(op, threads)
                cands = [Candidate(op, s, source="manual") for s in hand_picked(op, hw, threads)]
                results = runner.measure(cands)
                after = runner.measure_numpy(op, threads)
                numpy_g = max((r.gflops for r in (before, after) if r.ok and r.gflops),
                              default=None)
                top = best(results)
                row = Row(label, group, op, threads, top, numpy_g, len(cands),
                          sum(r.ok for r in results))
                rows.append(row)
                print(f"[{threads}T] {label:<40} kernel {_g(top.gflops if top else None)} "
                      f"numpy {_g(numpy_g)} ratio {_r(row.ratio)} "
                      f"({row.ok}/{row.candidates} ok) {top.schedule if top else ''}",
                      flush=True)
    return rows, peaks


def _g(x: float | None) -> str:
    return f"{x:7.1f}" if x else "    n/a"


def _r(x: float | None) -> str:
    return f"{x:.2f}x" if x else "n/a"


def render(rows: list[Row], peaks: dict, timing: TimingConfig) -> str:
    lines = [machine_summary(), "", f"Revision `{git_revision()}`. Timing: "
             f"≥ {timing.min_repeats} repeats and ≥ {timing.min_time_s:g} s per kernel, median "
             "of per-call times; our kernels' OpenMP threads pinned (OMP_PROC_BIND=close, "
             "OMP_PLACES=cores); numpy timed in its own worker process with its BLAS limited to "
             "the same thread count by threadpoolctl. "
             "numpy's figure includes its separate bias-add pass (it has no fused epilogue).",
             ""]
    lines.append("Measured FMA peak (float32, this run): " + ", ".join(
        f"{t} thread(s) {p:.1f} GFLOP/s" for t, p in peaks.items()) + ".")
    lines.append("")
    lines.append("| shape | op | threads | kernel GFLOP/s | numpy GFLOP/s | ratio | "
                 "% of peak | best schedule |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        k = r.kernel
        pct = f"{100 * k.gflops / peaks[r.threads]:.0f}%" if k and k.gflops else "n/a"
        lines.append(
            f"| {r.label} | `{r.op.text}` | {r.threads} | {_g(k.gflops if k else None).strip()} "
            f"| {_g(r.numpy_gflops).strip()} | {_r(r.ratio)} | {pct} | "
            f"`{k.schedule if k else '-'}` |"
        )
    lines.append("")
    for threads in sorted({r.threads for r in rows}):
        for group in ("model", "square"):
            ratios = [r.ratio for r in rows if r.threads == threads and r.group == group
                      and r.ratio]
            if ratios:
                lines.append(f"- {threads} thread(s), {group} shapes: median ratio "
                             f"**{statistics.median(ratios):.2f}x**, min {min(ratios):.2f}x, "
                             f"max {max(ratios):.2f}x.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--min-time", type=float, default=0.3)
    parser.add_argument("--quick", action="store_true", help="skip the 2048 square")
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    parser.add_argument("--json", type=Path, help="also write raw rows as JSON here")
    parser.add_argument("--section", default="matmul_vs_blas",
                        help="the block of this script's BENCHMARKS.md section to write (one per "
                             "ISA level)")
    args = parser.parse_args()
    hw = local_spec()
    threads = [t for t in args.threads if t <= hw.cores]
    timing = TimingConfig(min_time_s=args.min_time, min_repeats=7, timeout_s=120.0)
    rows, peaks = run(threads, timing, args.quick)
    text = render(rows, peaks, timing)
    print(text)
    if args.json:
        args.json.write_text(json.dumps([
            {"label": r.label, "op": r.op.text, "threads": r.threads, "ratio": r.ratio,
             "numpy_gflops": r.numpy_gflops,
             "kernel": r.kernel.summary() if r.kernel else None} for r in rows], indent=2))
    if not args.no_write:
        write_section(text, args.section)


if __name__ == "__main__":
    main()
