"""Winograd against the direct kernel on the 3x3 stride-1 layers of the CNN zoo.

For each layer (batch 1, bias and relu fused, activations in the blocked layout
``nchw{x}c`` that compiled models keep between kernels, x = the vector width, weights packed
once) the tiler's best ``direct`` schedule and its best ``winograd`` schedule (top-1 by the
analytic estimate within each algorithm) are timed alternately with onnxruntime's one-node
``Conv`` (+``Relu``, NCHW in and out: onnxruntime converts to its own blocked layout inside
the call, so its figure includes that), ``--repeats`` times each at one thread; medians.
The rows also give the tiler's overall pick, what an untuned compile runs.

    python benchmarks/winograd.py [--repeats 9] [--only resnet50]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from _report import git_revision, machine_summary, write_section
from blocked_layout import compare, timer

from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.conv2d import conv2d_op
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.runtime import check_result, compile_kernel, random_inputs, reference
from tunecache.compiler.schedule import Schedule
from tunecache.tuner.search.roller import candidates

HW = dataclasses.replace(local_spec(), cores=1)
Row = tuple[str, str, float, float, float, str, str, "str | None"]
"""network, layer, direct s, winograd s, onnxruntime s, winograd schedule, pick, check."""

# (network, C, H, F): the distinct 3x3 stride-1 dense layers of benchmarks/cnn_zoo.py at 224.
LAYERS = [
    ("resnet50", 64, 56, 64), ("resnet50", 128, 28, 128), ("resnet50", 256, 14, 256),
    ("resnet50", 512, 7, 512),
    ("vgg16", 64, 224, 64), ("vgg16", 128, 112, 128), ("vgg16", 256, 56, 256),
    ("vgg16", 512, 28, 512), ("vgg16", 512, 14, 512),
    ("densenet121", 128, 56, 32), ("densenet121", 128, 7, 32),
    ("googlenet", 96, 28, 128), ("googlenet", 112, 14, 224),
    ("squeezenet1_1", 32, 55, 128), ("squeezenet1_1", 64, 13, 256),
]


def layer_op(c: int, h: int, f: int) -> OpSignature:
    layout = f"nchw{max(8, HW.lanes)}c"
    return conv2d_op(1, c, h, h, f, 3, 3, pads=1, epilogue="bias+relu", layout=layout,
                     out_layout=layout)


def ort_timer(op: OpSignature) -> Callable[[], float]:
    """Seconds per call of onnxruntime's Conv+Relu on the NCHW version of ``op``."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    d = op.dims_dict
    rng = np.random.default_rng(0)
    w = rng.standard_normal((d["F"], d["C"], 3, 3)).astype(np.float32) * 0.05
    b = rng.standard_normal(d["F"]).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, d["C"], d["H"], d["W"]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    feeds = {"x": rng.standard_normal((1, d["C"], d["H"], d["W"])).astype(np.float32)}

    def calls(iters: int) -> float:
        start = time.perf_counter()
        for _ in range(iters):
            session.run(None, feeds)
        return time.perf_counter() - start
    iters = max(1, int(0.02 / max(calls(3) / 3, 1e-7)))

    def run() -> float:
        return statistics.median(calls(iters) / iters for _ in range(5))
    return run


def best_per_algorithm(op: OpSignature) -> dict[str, Conv2dSchedule]:
    """The tiler's best schedule of each algorithm (by estimate), plus ``pick``, its overall
    first choice (what an untuned compile runs)."""
    pool = [c.schedule for c in candidates(op, HW, k=200, threads=1)
            if isinstance(c.schedule, Conv2dSchedule)]
    best = {"pick": pool[0]}
    for schedule in pool:
        best.setdefault(schedule.algorithm, schedule)
    return best


def check(op: OpSignature, schedule: Schedule) -> str | None:
    kernel = compile_kernel(op, schedule, HW)
    inputs = random_inputs(op, seed=1)
    return check_result(op, inputs, kernel(*inputs), reference(op, inputs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--only", help="comma-separated networks")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    rows: list[Row] = []
    print(f"{HW.cpu_model}, {HW.isa}, 1 thread "
          f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')})")
    for net, c, h, f in LAYERS:
        if only and net not in only:
            continue
        op = layer_op(c, h, f)
        best = best_per_algorithm(op)
        direct, wino, pick = best["direct"], best["winograd"], best["pick"]
        bad = check(op, wino)
        timers = {"direct": timer(op, direct), "winograd": timer(op, wino),
                  "onnxruntime": ort_timer(op)}
        got = compare(timers, args.repeats)
        row = (net, f"{c}->{f} @{h}", got["direct"], got["winograd"], got["onnxruntime"],
               str(wino), pick.algorithm, bad)
        rows.append(row)
        print(f"{net:14} {row[1]:16} direct {got['direct'] * 1e3:7.3f} ms  winograd "
              f"{got['winograd'] * 1e3:7.3f} ms ({got['direct'] / got['winograd']:.2f}x)  "
              f"onnxruntime {got['onnxruntime'] * 1e3:7.3f} ms  pick {pick.algorithm}  "
              f"{wino}  {bad or 'ok'}", flush=True)
    if not args.no_write and rows:
        write_section(render(rows, args))
    return 0


def render(rows: list[Row], args: argparse.Namespace) -> str:
    lines = [machine_summary(),
             f"Command: `python benchmarks/winograd.py {' '.join(sys.argv[1:])}`, revision "
             f"`{git_revision()}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
             "",
             f"One thread, batch 1, bias+relu, blocked layout, weights packed once; medians of "
             f"{args.repeats} interleaved repeats. Speed-up = direct ÷ winograd; "
             "÷ onnxruntime = winograd ÷ onnxruntime's one-node Conv+Relu (NCHW).",
             "",
             "| network | layer | direct | winograd | speed-up | onnxruntime | winograd ÷ "
             "onnxruntime | winograd schedule | tiler's pick | check |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for net, label, d, w, o, sched, pick, bad in rows:
        lines.append(f"| {net} | {label} | {d * 1e3:.3f} ms | {w * 1e3:.3f} ms | "
                     f"**{d / w:.2f}x** | {o * 1e3:.3f} ms | {w / o:.2f} | `{sched}` | {pick} | "
                     f"{bad or 'ok'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
