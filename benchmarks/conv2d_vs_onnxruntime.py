"""Generated conv2d kernels against onnxruntime on every distinct convolution of ResNet-50 and
MobileNet-v2 at batch 1.

For every layer and thread count, a small hand-picked schedule set (direct NCHW[x]c and
implicit-GEMM variants, no search) is built, checked and timed with the tuner's ``Runner``
(timing inside the worker process), and the best is compared with onnxruntime running a
one-node ``Conv`` model (weights and bias as initializers, as in a real model, so onnxruntime
may pre-pack them; ``intra_op_num_threads`` set to the same thread count, output bound once
with IOBinding), timed before and after the candidates in the same run; its better figure
is used. Ours are timed two ways: receiving the weights in ONNX's OIHW layout and repacking
them inside every timed call (what tuning records), and with the weights bound once
(``Kernel.bind_weights``: what a compiled model runs, and what onnxruntime does with
initializers). Results are printed and written to docs/BENCHMARKS.md.

Layers are taken from the suites in :mod:`tunecache.datasets.suites` with the epilogue
reduced to ``bias`` (what a one-node Conv computes); layers that differ only in epilogue are
measured once.

    python benchmarks/conv2d_vs_onnxruntime.py [--threads 1 2] [--min-time 0.1] [--no-write]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tunecache.compiler.kinds.conv2d import conv2d_op

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_revision, machine_summary, write_section

from tunecache.compiler.hardware import HardwareSpec, local_spec
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule, default_conv2d_schedule, is_depthwise
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import random_inputs, reference
from tunecache.compiler.schedule import problems
from tunecache.datasets.suites import get_suite
from tunecache.tuner.measure import Candidate, MeasureResult, Runner, TimingConfig, best


def layers() -> list[tuple[str, str, OpSignature]]:
    """(model, label, op) for every distinct conv shape of the two suites, epilogue ``bias``."""
    out: list[tuple[str, str, OpSignature]] = []
    seen: set[OpSignature] = set()
    for model in ("resnet50", "mobilenet_v2"):
        for w in get_suite(model).workloads:
            if w.op.kind != "conv2d":
                continue
            d = w.op.dims_dict
            op = conv2d_op(
                d["N"], d["C"], d["H"], d["W"], d["F"], d["R"], d["S"],
                stride=(d["stride_h"], d["stride_w"]),
                pads=(d["pad_t"], d["pad_l"], d["pad_b"], d["pad_r"]),
                dilation=(d["dil_h"], d["dil_w"]), groups=d["groups"], epilogue="bias")
            if op not in seen:
                seen.add(op)
                out.append((model, w.label.split(";")[0], op))
    return out


def hand_picked(op: OpSignature, hw: HardwareSpec, threads: int) -> list[Conv2dSchedule]:
    """Up to a dozen schedules: direct tiles x loop order, then implicit-GEMM tiles x weight
    packing, or for depthwise convolutions plane-kernel tiles."""
    L = hw.lanes
    q, p = op.out_w, op.out_h
    d = op.dims_dict
    cg = d["C"] // d["groups"]
    pars = ["oc", "pixel"] if threads > 1 else ["oc"]
    cands: list[Conv2dSchedule] = [default_conv2d_schedule(op, hw, threads)]
    big = hw.vector_registers > 16
    direct_tiles = [(2, 14, 1), (1, 28, 1)] if big else [(1, 12, 1), (2, 6, 1)]
    if q <= 7:
        direct_tiles += [(2, q, 2), (1, q, 4)] if big else [(2, q, 1), (1, q, 2)]
    for nv, ow, oh in direct_tiles:
        for par in pars:
            for order in ("fp", "pf"):
                cands.append(Conv2dSchedule(
                    oc_block=nv * L, ow_block=min(ow, q), oh_block=min(oh, p),
                    ic_block=1 if is_depthwise(op) else min(cg, 64), loop_order=order,
                    threads=threads, parallel=par))
    if is_depthwise(op):
        # The plane kernel: output columns in the lanes, no layout conversion.
        for nv, oh in ([(1, 4), (2, 2), (2, 4), (4, 2)] if big else [(1, 2), (2, 1)]):
            cands.append(Conv2dSchedule(oc_block=L, ow_block=nv * L, oh_block=min(oh, p),
                                        ic_block=1, pack_w=0, unroll_kw=1, threads=threads,
                                        parallel="oc"))
    else:
        gemm_tiles = [(12, 2), (6, 4)] if big else [(6, 2)]
        for mr, nv in gemm_tiles:
            for pack_w in (1, 0):
                for par in pars:
                    cands.append(Conv2dSchedule(
                        oc_block=mr, ow_block=nv * L, ic_block=min(cg, 128), algorithm="gemm",
                        pack_w=pack_w, threads=threads, parallel=par))
    out: list[Conv2dSchedule] = []
    for s in cands:
        if not problems(op, s, hw) and s not in out:
            out.append(s)
    return out


def time_ort(op: OpSignature, threads: int, timing: TimingConfig) -> tuple[float, str | None]:
    """(median seconds per call, mismatch message or None) for onnxruntime on ``op``."""
    from tunecache.tuner.measure.onnx_baseline import run_conv, time_onnxruntime_conv

    inputs = random_inputs(op, seed=timing.seed)
    out = run_conv(op, inputs, threads)
    expected = reference(op, inputs)
    err = float(np.max(np.abs(out - expected)))
    scale = float(np.max(np.abs(expected))) or 1.0
    mismatch = None if err <= 1e-3 * scale else f"onnxruntime differs by {err:.3g}"
    samples = time_onnxruntime_conv(op, threads, timing.request(), seed=timing.seed)
    return float(np.median(samples)), mismatch


@dataclass
class Row:
    model: str
    label: str
    op: OpSignature
    threads: int
    kernel: MeasureResult | None
    ort_s: float | None
    candidates: int
    ok: int
    bound: MeasureResult | None = None

    @property
    def ort_gflops(self) -> float | None:
        return self.op.flops / self.ort_s / 1e9 if self.ort_s else None

    @property
    def ratio(self) -> float | None:
        if self.kernel is None or not self.kernel.gflops or not self.ort_gflops:
            return None
        return self.kernel.gflops / self.ort_gflops

    @property
    def ratio_bound(self) -> float | None:
        if self.bound is None or not self.bound.gflops or not self.ort_gflops:
            return None
        return self.bound.gflops / self.ort_gflops


def run(threads_list: list[int], timing: TimingConfig, only: str | None) -> list[Row]:
    hw = local_spec()
    rows: list[Row] = []
    todo = [x for x in layers() if only is None or x[0] == only]
    per_call = dataclasses.replace(timing, prepacked_weights=False)
    bound_timing = dataclasses.replace(timing, prepacked_weights=True)
    with Runner(hw, per_call) as runner, Runner(hw, bound_timing) as bound_runner:
        for threads in threads_list:
            for model, label, op in todo:
                before, problem = time_ort(op, threads, timing)
                cands = [Candidate(op, s, source="manual") for s in hand_picked(op, hw, threads)]
                results = runner.measure(cands)
                bound = best(bound_runner.measure(cands))
                after, _ = time_ort(op, threads, timing)
                top = best(results)
                row = Row(model, label, op, threads, top, min(before, after), len(cands),
                          sum(r.ok for r in results), bound)
                rows.append(row)
                bad = [r for r in results if not r.ok]
                print(f"[{threads}T] {model:<12} {label:<32} kernel {_g(top.gflops if top else None)}"
                      f" ort {_g(row.ort_gflops)} ratio {_r(row.ratio)} bound {_r(row.ratio_bound)}"
                      f" ({row.ok}/{row.candidates}"
                      f" ok) {top.schedule if top else ''}"
                      + (f" [{problem}]" if problem else "")
                      + (f" first failure: {bad[0].status} {bad[0].error}" if bad else ""),
                      flush=True)
    return rows


def _g(x: float | None) -> str:
    return f"{x:7.1f}" if x else "    n/a"


def _r(x: float | None) -> str:
    return f"{x:.2f}x" if x else "n/a"


def _short(op: OpSignature) -> str:
    d = op.dims_dict
    text = (f"{d['C']}→{d['F']} {d['R']}x{d['S']}/{d['stride_h']} @{d['H']}x{d['W']}")
    if d["groups"] > 1:
        text += " dw" if is_depthwise(op) else f" g{d['groups']}"
    return text


def render(rows: list[Row], timing: TimingConfig) -> str:
    import onnxruntime as ort

    lines = [machine_summary(), "", f"Revision `{git_revision()}`; onnxruntime {ort.__version__}. "
             f"Timing: ≥ {timing.min_repeats} repeats and ≥ {timing.min_time_s:g} s per kernel, "
             "median of per-call times. Ours: best of the hand-picked schedule set "
             "(`hand_picked` in the script), OpenMP threads pinned; the input layout "
             "conversion (NCHW → padded NCHW[x]c or im2col panels) happens inside every timed "
             "call, and so does the weight repacking in the *per-call* columns; *bound* "
             "columns time the same candidates with the weights packed once "
             "(`Kernel.bind_weights`, as compiled models run). onnxruntime: a one-node Conv "
             "model with weights and bias as initializers (so it may pre-pack them once, at "
             "session creation), "
             "`intra_op_num_threads` = threads, ORT_ENABLE_ALL, output bound once; best of a "
             "run before and after our candidates. Epilogue: bias only (a one-node Conv).", ""]
    lines.append("| model | layer | conv | threads | ours per-call GFLOP/s | ours bound GFLOP/s "
                 "| onnxruntime GFLOP/s | ratio per-call | ratio bound | best schedule (bound) |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        k, b = r.kernel, r.bound
        lines.append(
            f"| {r.model} | {r.label} | {_short(r.op)} | {r.threads} | "
            f"{_g(k.gflops if k else None).strip()} | {_g(b.gflops if b else None).strip()} | "
            f"{_g(r.ort_gflops).strip()} | {_r(r.ratio)} | {_r(r.ratio_bound)} | "
            f"`{b.schedule if b else '-'}` |")
    lines.append("")
    for threads in sorted({r.threads for r in rows}):
        for model, kind in [(m, k) for k in ("bound", "per-call")
                            for m in (None, "resnet50", "mobilenet_v2")]:
            ratios = [x for r in rows if r.threads == threads
                      and (model is None or r.model == model)
                      and (x := r.ratio_bound if kind == "bound" else r.ratio)]
            if ratios:
                label = ("all layers" if model is None else model) + f", {kind}"
                lines.append(
                    f"- {threads} thread(s), {label}: median ratio "
                    f"**{statistics.median(ratios):.2f}x** over {len(ratios)} layers, "
                    f"min {min(ratios):.2f}x, max {max(ratios):.2f}x; "
                    f"{sum(x >= 1.0 for x in ratios)} at or above 1.0x.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--min-time", type=float, default=0.1)
    parser.add_argument("--model", choices=["resnet50", "mobilenet_v2"], default=None,
                        help="only this model's layers")
    parser.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    parser.add_argument("--json", type=Path, help="also write raw rows as JSON here")
    args = parser.parse_args()
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        sys.exit("this benchmark needs onnx and onnxruntime: pip install 'tunecache[onnx,onnxruntime]'")
    hw = local_spec()
    threads = [t for t in args.threads if t <= hw.cores]
    timing = TimingConfig(min_time_s=args.min_time, min_repeats=7, timeout_s=120.0)
    rows = run(threads, timing, args.model)
    text = render(rows, timing)
    print(text)
    if args.json:
        args.json.write_text(json.dumps([
            {"model": r.model, "label": r.label, "op": r.op.text, "threads": r.threads,
             "ratio": r.ratio, "ratio_bound": r.ratio_bound, "ort_gflops": r.ort_gflops,
             "kernel": r.kernel.summary() if r.kernel else None,
             "bound": r.bound.summary() if r.bound else None} for r in rows], indent=2))
    if not args.no_write:
        write_section(text)


if __name__ == "__main__":
    main()
