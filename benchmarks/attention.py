"""The fused ``attention`` kernel against the unfused numpy path and onnxruntime's Attention.

For each shape, the tiler's top candidates and the default schedule are built and screened
(the fastest is kept, after a check against the float64 reference); then it, numpy and
onnxruntime are timed in rounds, one repeat of each per round, so that load on a shared
machine spreads over all three. numpy is the kind's float32 reference: ``Q @ K^T``, scale,
mask, a stable softmax and ``@ V`` with OpenBLAS (its BLAS limited to the same thread count).
onnxruntime runs a one-node ONNX ``Attention`` (opset 23) model, the batch items as heads,
the padding mask materialised to ``[1, 1, M, N]`` (the shape its CPU kernel accepts); it is
skipped, with the reason, when onnxruntime or onnx is missing or the model is refused.

Reported: medians of wall-clock time per call and of the calling thread's CPU time per call
(at one thread the latter ignores time lost to other processes on a busy machine). Nothing
is written to docs/BENCHMARKS.md.

    python benchmarks/attention.py [--threads 1] [--top 4] [--min-time 0.3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_revision, machine_summary

from tunecache.compiler.hardware import HardwareSpec, local_spec
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.kinds.attention import causal_keep, has_padding, is_causal
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_result, compile_kernel, random_inputs, reference
from tunecache.compiler.schedule import Schedule, default_schedule
from tunecache.tuner.search.roller import candidates

P = OpSignature.parse
SHAPES: list[tuple[str, OpSignature]] = [
    ("BERT-base, seq 128 (12 heads, padding mask)",
     P("attention(B=12,M=128,N=128,D=64,mask_rows=1,mask=padding)")),
    ("BERT-base, seq 384 (12 heads, padding mask)",
     P("attention(B=12,M=384,N=384,D=64,mask_rows=1,mask=padding)")),
    ("GPT-2 prefill, seq 128 (causal)", P("attention(B=12,M=128,N=128,D=64,mask=causal)")),
    ("GPT-2 decode step, 128 past tokens", P("attention(B=12,M=1,N=129,D=64,mask=causal)")),
]

Call = Callable[[int], None]
"""Runs the implementation ``n`` times back to back."""


@dataclass(frozen=True)
class Timing:
    """Medians per call: wall-clock and the calling thread's CPU time (seconds)."""

    wall_s: float
    cpu_s: float


def _calibrate(call: Call, seconds: float) -> int:
    n = 1
    while True:
        start = time.perf_counter()
        call(n)
        took = time.perf_counter() - start
        if took >= seconds or n >= 1 << 20:
            return n
        n = max(n * 2, int(n * seconds / max(took, 1e-9)))


def time_rounds(calls: dict[str, Call], min_time: float, repeats: int) -> dict[str, Timing]:
    """``repeats`` rounds, each timing one repeat of every call (about ``min_time / repeats``
    seconds each)."""
    iters = {name: _calibrate(call, min_time / repeats) for name, call in calls.items()}
    wall: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            w0, c0 = time.perf_counter(), time.thread_time()
            call(iters[name])
            wall[name].append((time.perf_counter() - w0) / iters[name])
            cpu[name].append((time.thread_time() - c0) / iters[name])
    return {name: Timing(statistics.median(wall[name]), statistics.median(cpu[name]))
            for name in calls}


def _kernel_call(op: OpSignature, schedule: Schedule, hw: HardwareSpec,
                 inputs: tuple[np.ndarray, ...]) -> Call:
    kernel = compile_kernel(op, schedule, hw)
    out = np.empty(op.arguments()[-1].shape, np.float32)
    problem = check_result(op, inputs, kernel(*inputs, out=out), reference(op, inputs))
    if problem:
        raise SystemExit(f"error: {op.text} {schedule}: {problem}")

    def call(n: int) -> None:
        kernel.time(*inputs, out=out, iters=n)  # the loop runs inside the shared object

    return call


def best_schedule(op: OpSignature, hw: HardwareSpec, threads: int, top: int,
                  inputs: tuple[np.ndarray, ...], min_time: float) -> tuple[Schedule, Call]:
    """The fastest (CPU time) of the tiler's top ``top`` and the default schedule."""
    pool = [c.schedule for c in candidates(op, hw, k=top, threads=threads)]
    pool += [s for s in [default_schedule(op, hw, threads)] if s not in pool]
    calls = {str(i): _kernel_call(op, s, hw, inputs) for i, s in enumerate(pool)}
    timed = time_rounds(calls, min_time, 3)
    pick = min(timed, key=lambda name: timed[name].cpu_s)
    return pool[int(pick)], calls[pick]


def _numpy_call(op: OpSignature, inputs: tuple[np.ndarray, ...], threads: int) -> Call:
    ref = op_kind("attention").reference

    def call(n: int) -> None:
        with threadpool_limits(threads):
            for _ in range(n):
                ref(op, inputs)

    return call


def _onnxruntime_call(op: OpSignature, inputs: tuple[np.ndarray, ...],
                      threads: int) -> Call | str:
    """A call running onnxruntime's Attention on the same data, or why there is none."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError as exc:
        return f"not installed ({exc.name}); pip install 'tunecache[onnxruntime]' onnx"
    d = op.dims_dict
    b, m, n, dim = d["B"], d["M"], d["N"], d["D"]
    dv = d["Dv"] or dim
    q, k, v = (x.reshape(1, b, *x.shape[1:]) for x in inputs[:3])
    feed = {"Q": q, "K": k, "V": v}
    mask = np.zeros((1, 1, m, n), np.float32)
    if op.attr("mask") == "full":
        return "full masks are not mapped onto onnxruntime's Attention here"
    if has_padding(op):
        if d["mask_rows"] != 1:
            return "per-item padding masks are not mapped onto heads here"
        mask += inputs[-1][0]
    causal_flag = 0
    if is_causal(op) and m == n:
        causal_flag = 1  # ONNX's causal mask is aligned top-left: the same when square
    elif is_causal(op):
        mask[0, 0][~causal_keep(m, n)] = -np.inf
    if has_padding(op) or (is_causal(op) and m != n and m > 1):
        feed["mask"] = mask
    scale = float(inputs[3][0]) if op.attr("scale") == "input" else dim ** -0.5
    tensors = [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(x.shape))
               for name, x in feed.items()]
    node = helper.make_node("Attention", list(feed), ["Y"], is_causal=causal_flag, scale=scale)
    graph = helper.make_graph([node], "attention", tensors, [
        helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, b, m, dv])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        got = session.run(None, feed)[0].reshape(b, m, dv)
    except Exception as exc:  # onnxruntime raises its own exception types
        return f"refused: {str(exc).splitlines()[0][:120]}"
    problem = check_result(op, inputs, got, reference(op, inputs))
    if problem:
        return f"differs from the reference: {problem}"

    def call(count: int) -> None:
        for _ in range(count):
            session.run(None, feed)

    return call


@dataclass(frozen=True)
class Row:
    label: str
    op: OpSignature
    schedule: Schedule
    times: dict[str, Timing]
    onnxruntime_note: str


def run(threads: int, top: int, min_time: float, repeats: int) -> list[Row]:
    hw = local_spec()
    rows = []
    for label, op in SHAPES:
        inputs = random_inputs(op, seed=0)
        schedule, ours = best_schedule(op, hw, threads, top, inputs, min_time / 2)
        calls = {"fused": ours, "numpy": _numpy_call(op, inputs, threads)}
        ort = _onnxruntime_call(op, inputs, threads)
        note = ort if isinstance(ort, str) else ""
        if not isinstance(ort, str):
            calls["onnxruntime"] = ort
        times = time_rounds(calls, min_time, repeats)
        rows.append(Row(label, op, schedule, times, note))
        print(f"{label}: " + ", ".join(f"{name} {t.wall_s * 1e3:.3f} ms wall / "
                                        f"{t.cpu_s * 1e3:.3f} ms cpu" for name, t in times.items())
              + (f" (onnxruntime {note})" if note else ""), flush=True)
    return rows


def render(rows: list[Row], threads: int, min_time: float, repeats: int) -> str:
    lines = [machine_summary(), "", f"Revision `{git_revision()}`, {threads} thread(s). "
             f"Medians of {repeats} rounds (about {min_time:g} s per implementation and shape); "
             "ratios are numpy or onnxruntime time over the fused kernel's, CPU time first "
             "(wall-clock in parentheses).", "",
             "| shape | op | fused ms | numpy ms | onnxruntime ms | vs numpy | vs onnxruntime "
             "| fused GFLOP/s | schedule |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f, n, o = r.times["fused"], r.times["numpy"], r.times.get("onnxruntime")
        ort_ms = f"{o.cpu_s * 1e3:.3f} ({o.wall_s * 1e3:.3f})" if o else f"n/a: {r.onnxruntime_note}"
        vs_ort = f"{o.cpu_s / f.cpu_s:.2f}x ({o.wall_s / f.wall_s:.2f}x)" if o else "n/a"
        lines.append(
            f"| {r.label} | `{r.op.text}` | {f.cpu_s * 1e3:.3f} ({f.wall_s * 1e3:.3f}) | "
            f"{n.cpu_s * 1e3:.3f} ({n.wall_s * 1e3:.3f}) | {ort_ms} | "
            f"{n.cpu_s / f.cpu_s:.2f}x ({n.wall_s / f.wall_s:.2f}x) | {vs_ort} | "
            f"{r.op.flops / f.cpu_s / 1e9:.1f} | `{r.schedule}` |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=4, help="tiler candidates screened per op")
    parser.add_argument("--min-time", type=float, default=0.3,
                        help="seconds of timing per implementation and shape")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", type=Path, help="also write raw rows as JSON here")
    args = parser.parse_args()
    rows = run(args.threads, args.top, args.min_time, args.repeats)
    print(render(rows, args.threads, args.min_time, args.repeats))
    if args.json:
        args.json.write_text(json.dumps([{
            "label": r.label, "op": r.op.text, "schedule": r.schedule.to_json(),
            "onnxruntime_note": r.onnxruntime_note,
            **{f"{name}_{kind}_s": getattr(t, f"{kind}_s") for name, t in r.times.items()
               for kind in ("wall", "cpu")},
        } for r in rows], indent=2))


if __name__ == "__main__":
    main()
