"""Low-precision matmul kernels (int8 and bf16) against onnxruntime's int8 path
(MatMulInteger) and float32 (ours and onnxruntime's MatMul) on BERT-base's projection shapes
(issue 53); onnxruntime's CPU provider has no bf16 MatMul, so bf16 is compared with float32.

Every engine runs in its own process, timed in lockstep rounds (ours, then onnxruntime, per
round), one or two threads pinned to cores, medians of rounds. Ours: the kernel with its
weights packed once (as a compiled model runs it), timed inside the shared object; int8 and
bf16 with the dialect this machine's spec selects (VNNI, AVX512-BF16 where the CPU has
them), float32 with the tiler's top-1 schedule, untuned. onnxruntime: a one-node model,
weights as initializers, all graph optimisations, ``intra_op_num_threads`` set. Outputs are
checked (int8 exactly against numpy) before timing.

    python benchmarks/lowp_matmul.py [--threads 1 2] [--rounds 5] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_revision, machine_summary, write_section

SHAPES = [(128, 768, 768), (128, 3072, 768), (128, 768, 3072)]
"""BERT-base at sequence 128: the Q/K/V and output projections, FFN up, FFN down."""

_OURS = """
import json, statistics, sys
import numpy as np
from tunecache.compiler.hardware import local_spec
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.runtime import compile_kernel, random_inputs
from tunecache.compiler.schedule import default_schedule
from tunecache.tuner.search.roller import candidates
m, n, k, threads, dtype = {m}, {n}, {k}, {threads}, {dtype!r}
hw = local_spec()
op = matmul_op(m, n, k, dtype=dtype)
schedule = (default_schedule(op, hw, threads) if dtype != "float32"
            else candidates(op, hw, k=1, threads=threads)[0].schedule)
a, b = random_inputs(op, seed=1)
kernel = compile_kernel(op, schedule, hw).bind_weights(b)
out = kernel(a)
if dtype == "int8":
    assert np.array_equal(out, a.astype(np.int64) @ b.astype(np.int64))
iters = max(3, int(2e9 / op.flops))
kernel.time(a, out=out, iters=iters)
print(json.dumps(statistics.median(kernel.time(a, out=out, iters=iters) / iters
                                   for _ in range(7)) * 1e3))
"""

_ORT = """
import json, statistics, time
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
m, n, k, threads, dtype = {m}, {n}, {k}, {threads}, {dtype!r}
rng = np.random.default_rng(1)
if dtype == "int8":
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    node = helper.make_node("MatMulInteger", ["A", "B"], ["C"])
    types = (TensorProto.UINT8, TensorProto.INT32)
else:
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    node = helper.make_node("MatMul", ["A", "B"], ["C"])
    types = (TensorProto.FLOAT, TensorProto.FLOAT)
graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", types[0], [m, k])],
                          [helper.make_tensor_value_info("C", types[1], [m, n])],
                          [numpy_helper.from_array(b, "B")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
options = ort.SessionOptions()
options.intra_op_num_threads = threads
session = ort.InferenceSession(model.SerializeToString(), options,
                               providers=["CPUExecutionProvider"])
out = session.run(None, {{"A": a}})[0]
if dtype == "int8":
    assert np.array_equal(out, a.astype(np.int64) @ b.astype(np.int64))
iters = max(3, int(2e9 / (2 * m * n * k)))
samples = []
for _ in range(7):
    t = time.perf_counter()
    for _ in range(iters):
        session.run(None, {{"A": a}})
    samples.append((time.perf_counter() - t) / iters)
print(json.dumps(statistics.median(samples) * 1e3))
"""


def _run(template: str, shape: tuple[int, int, int], threads: int, dtype: str) -> float:
    m, n, k = shape
    code = template.format(m=m, n=n, k=k, threads=threads, dtype=dtype)
    cores = ",".join(str(c) for c in range(threads))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(["taskset", "-c", cores, sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


def _row(shape: tuple[int, int, int], threads: int, rounds: int) -> dict[str, float]:
    engines = {"ours int8": (_OURS, "int8"), "ort int8": (_ORT, "int8"),
               "ours bf16": (_OURS, "bf16"), "ours f32": (_OURS, "float32"),
               "ort f32": (_ORT, "float32")}
    samples: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(rounds):
        for name, (template, dtype) in engines.items():
            samples[name].append(_run(template, shape, threads, dtype))
    return {name: statistics.median(times) for name, times in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    table = ["| M x N x K | threads | ours int8 (ms) | ort int8 (ms) | ours bf16 (ms) | "
             "ours f32 (ms) | ort f32 (ms) | int8: ours ÷ ort | ours int8 ÷ f32 | "
             "ours bf16 ÷ f32 |", "|---" * 10 + "|"]
    for shape in SHAPES:
        for threads in args.threads:
            t = _row(shape, threads, args.rounds)
            line = (f"| {'x'.join(map(str, shape))} | {threads} | {t['ours int8']:.3f} | "
                    f"{t['ort int8']:.3f} | {t['ours bf16']:.3f} | {t['ours f32']:.3f} | "
                    f"{t['ort f32']:.3f} | {t['ours int8'] / t['ort int8']:.2f} | "
                    f"{t['ours int8'] / t['ours f32']:.2f} | "
                    f"{t['ours bf16'] / t['ours f32']:.2f} |")
            print(line, flush=True)
            table.append(line)
    from tunecache.compiler.hardware import local_spec

    text = (f"{machine_summary()}\nRevision {git_revision()}; features "
            f"{', '.join(local_spec().features) or 'none'}; {args.rounds} lockstep rounds, "
            "medians; ours untuned (int8: the default tile; f32: the tiler's top-1).\n\n"
            + "\n".join(table))
    if not args.no_write:
        write_section(text)


if __name__ == "__main__":
    main()
