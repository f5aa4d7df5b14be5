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
from tunecache.tuner.search.roller import candidates
m, n, k, threads, dtype = {m}, {n}, {k}, {threads}, {dtype!r}
hw = local_spec()
op = matmul_op(m, n, k, dtype=dtype)
schedule = candidates(op, hw, k=1, threads=threads)[0].schedule
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


_PEAK = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
#if defined(TILES)
#pragma GCC target("amx-tile,amx-int8,amx-bf16")
int main(void) {
  if (syscall(SYS_arch_prctl, 0x1023, 18)) return 1;
  struct { uint8_t p, s, r[14]; uint16_t c[16]; uint8_t rows[16]; } cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.p = 1;
  for (int t = 0; t < 8; t++) { cfg.c[t] = 64; cfg.rows[t] = 16; }
  _tile_loadconfig(&cfg);
  static char buf[1024] __attribute__((aligned(64)));
  _tile_loadd(4, buf, 64);
  _tile_loadd(5, buf, 64);
  _tile_loadd(6, buf, 64);
  _tile_loadd(7, buf, 64);
  const long n = 2000000;
  double t0 = now();
  for (long i = 0; i < n; i++) {
    TDOT(0, 4, 6); TDOT(1, 4, 7); TDOT(2, 5, 6); TDOT(3, 5, 7);
  }
  printf("%f\n", 4.0 * n * 16 * 16 * (64 / ELEMENT) * 2 / (now() - t0) / 1e9);
  _tile_release();
  return 0;
}
#else
#pragma GCC target("avx512f,avx512vnni,avx512bf16")
#define R24(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) \
  M(14) M(15) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23)
#define DECLARE(i) VEC c##i = ZERO;
#define STEP(i) c##i = DOT(c##i, a, b);
#define KEEP(i) __asm__ volatile("" : : "v"(c##i));
int main(void) {
  R24(DECLARE)
  OPND a = ONE, b = ONE;
  __asm__ volatile("" : "+v"(a), "+v"(b));  /* not constants the compiler could fold */
  const long n = 20000000;
  double t0 = now();
  for (long i = 0; i < n; i++) {
    R24(STEP)
    __asm__ volatile("" : "+v"(c0), "+v"(c12));  /* the loop is not hoisted past the clock */
  }
  double s = now() - t0;
  R24(KEEP)
  printf("%f\n", 24.0 * n * 64 / ELEMENT * 2 / s / 1e9);
  return 0;
}
#endif
"""
_PEAK_DEFINES = {
    "amx-int8": ["-DTILES", "-DTDOT=_tile_dpbusd", "-DELEMENT=1"],
    "amx-bf16": ["-DTILES", "-DTDOT=_tile_dpbf16ps", "-DELEMENT=2"],
    "vnni": ["-DVEC=__m512i", "-DOPND=__m512i", "-DZERO=_mm512_setzero_si512()",
             "-DONE=_mm512_set1_epi8(1)",
             "-DDOT=_mm512_dpbusd_epi32", "-DELEMENT=1"],
    "avx512-bf16": ["-DVEC=__m512", "-DOPND=__m512bh", "-DZERO=_mm512_setzero_ps()",
                    "-DONE=(__m512bh)_mm512_set1_epi16(0x3f80)", "-DDOT=_mm512_dpbf16_ps",
                    "-DELEMENT=2"]}
"""How the peak probe measures each engine: one core, no memory traffic (AMX: four tile
products on resident tiles an iteration; vectors: 24 independent accumulators)."""


def _engine(dtype: str) -> str | None:
    """The instruction this machine's int8 or bf16 kernels use: AMX, VNNI / AVX512-BF16, or
    none that has a peak of its own (16-bit pairs, widening FMAs)."""
    from tunecache.compiler.hardware import local_spec

    features = set(local_spec().features)
    if {"amx_tile", f"amx_{dtype}"} <= features:
        return f"amx-{dtype}"
    vector = {"int8": ("avx512_vnni", "vnni"), "bf16": ("avx512_bf16", "avx512-bf16")}[dtype]
    return vector[1] if vector[0] in features else None


def peak_gops(engine: str) -> float:
    """One core's measured peak of ``engine`` (GOP/s; a multiply-add counts two)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        source, program = Path(tmp) / "peak.c", Path(tmp) / "peak"
        source.write_text(_PEAK)
        subprocess.run(["cc", "-O3", "-march=native", *_PEAK_DEFINES[engine], str(source),
                        "-o", str(program)], check=True, capture_output=True)
        done = subprocess.run(["taskset", "-c", "0", str(program)], check=True,
                              capture_output=True, text=True)
    return float(done.stdout.split()[0])


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
    parser.add_argument("--section", default="lowp_matmul",
                        help="the BENCHMARKS.md section to rewrite (one per machine kind)")
    args = parser.parse_args()
    peaks = _peaks()
    table = ["| M x N x K | threads | ours int8 (ms) | ort int8 (ms) | ours bf16 (ms) | "
             "ours f32 (ms) | ort f32 (ms) | int8: ours ÷ ort | ours int8 ÷ f32 | "
             "ours bf16 ÷ f32 | share of peak: int8 / bf16 / f32 |", "|---" * 11 + "|"]
    for shape in SHAPES:
        for threads in args.threads:
            t = _row(shape, threads, args.rounds)
            line = (f"| {'x'.join(map(str, shape))} | {threads} | {t['ours int8']:.3f} | "
                    f"{t['ort int8']:.3f} | {t['ours bf16']:.3f} | {t['ours f32']:.3f} | "
                    f"{t['ort f32']:.3f} | {t['ours int8'] / t['ort int8']:.2f} | "
                    f"{t['ours int8'] / t['ours f32']:.2f} | "
                    f"{t['ours bf16'] / t['ours f32']:.2f} | {_shares(shape, threads, t, peaks)} |")
            print(line, flush=True)
            table.append(line)
    from tunecache.compiler.hardware import local_spec

    measured = "; ".join(f"{name} {gops:,.0f}" for name, gops in peaks.values() if gops)
    text = (f"{machine_summary()}\nRevision {git_revision()}; features "
            f"{', '.join(local_spec().features) or 'none'}; {args.rounds} lockstep rounds, "
            "medians; ours untuned (the tiler's top-1 of each dtype). Measured peaks, one "
            f"core, GOP/s: {measured} (the share of peak is over threads x that).\n\n"
            + "\n".join(table))
    if not args.no_write:
        write_section(text, args.section)


def _peaks() -> dict[str, tuple[str, float]]:
    """Per dtype, the engine our kernels use and its one-core peak (0: not measured)."""
    from tunecache.compiler.backends import backend_for
    from tunecache.compiler.hardware import local_spec

    hw = local_spec()
    out = {"float32": ("fp32 FMA", backend_for(hw).peak_gflops(hw, 1))}
    for dtype in ("int8", "bf16"):
        engine = _engine(dtype)
        out[dtype] = (engine or "", peak_gops(engine) if engine else 0.0)
    return out


def _shares(shape: tuple[int, int, int], threads: int, t: dict[str, float],
            peaks: dict[str, tuple[str, float]]) -> str:
    ops = 2.0 * shape[0] * shape[1] * shape[2]
    parts = []
    for dtype, name in (("int8", "ours int8"), ("bf16", "ours bf16"), ("float32", "ours f32")):
        peak = peaks[dtype][1] * threads
        parts.append(f"{ops / (t[name] * 1e-3) / 1e9 / peak:.0%}" if peak else "—")
    return " / ".join(parts)


if __name__ == "__main__":
    main()
