"""Measure the machine's peak float32 FMA throughput with a generated C kernel.

Peak is what kernels are judged against ("fraction of measured peak"), and it is measured,
not read off a spec sheet: AVX-512 on some CPUs runs at a lower clock or on one FMA unit.
"""

from __future__ import annotations

import numpy as np

from tunecache.compiler.backends.cpu.clib import c_library
from tunecache.compiler.backends.cpu.isa import BASE_FLAGS, dialect
from tunecache.compiler.buffers import aligned_empty
from tunecache.compiler.hardware import HardwareSpec, isa_level

MAX_CHAINS = 16
"""Independent accumulators: enough to cover FMA latency x throughput (8 on two pipes of
latency 4)."""


def chains(isa: str) -> int:
    """Accumulators the probe runs: :data:`MAX_CHAINS`, fewer where they and the two FMA
    operands would not fit the register file. Sixteen chains on AVX2's sixteen registers
    spilled every iteration and read 67 GFLOP/s on a core whose AVX2 kernels ran at 111."""
    return min(MAX_CHAINS, isa_level(isa).vector_registers - 4)


def _source(isa: str) -> str:
    d = dialect(isa)
    n = chains(isa)
    decl = ", ".join(f"a{i} = VSET1({i + 1}.0f)" for i in range(n))
    body = " ".join(f"a{i} = VFMA(a{i}, x, y);" for i in range(n))
    total = " + ".join(f"s[{i % d.lanes}] * 0.0f" for i in range(n))
    return f"""{d.prelude}
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
static double run(long iters) {{
  vec {decl};
  vec x = VSET1(0.999999f), y = VSET1(1e-7f);
  for (long i = 0; i < iters; i++) {{ {body} __asm__ volatile("" ::: "memory"); }}
  vec t = {" + ".join(f"a{i}" for i in range(n))};
  float s[{d.lanes}]; VSTOREU(s, t);
  return (double)({total});
}}
double tc_peak(long iters, int threads, double *sink) {{
  struct timespec t0, t1;
  double acc = 0.0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
#pragma omp parallel for num_threads(threads) reduction(+:acc)
  for (int t = 0; t < threads; t++) acc += run(iters);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  *sink = acc;
  return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}}
"""


def measure_peak_gflops(hw: HardwareSpec, threads: int = 1, seconds: float = 0.3) -> float:
    """Best-of-5 FMA throughput of ``threads`` threads at ``hw``'s ISA level, in GFLOP/s."""
    d = dialect(hw.isa)
    fn = c_library(_source(hw.isa), (*BASE_FLAGS, *d.flags, "-fopenmp")).function(
        "tc_peak", ("long", "int", "ptr"), "double")
    sink = np.zeros(1)
    iters = 100_000
    while fn(iters, threads, sink) < seconds / 5:
        iters *= 2
    best = min(fn(iters, threads, sink) for _ in range(5))
    flops = 2.0 * chains(hw.isa) * d.lanes * iters * threads
    return flops / best / 1e9


def _copy_source(isa: str) -> str:
    d = dialect(isa)
    return f"""{d.prelude}
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
/* STREAM "copy": y = x, vectors, each thread a contiguous range; streaming or plain stores. */
double tc_copy(const float *x, float *y, long n, int threads, int streaming) {{
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
#pragma omp parallel num_threads(threads)
  {{
#ifdef _OPENMP
    int tid = omp_get_thread_num(), nth = omp_get_num_threads();
#else
    int tid = 0, nth = 1;
#endif
    long per = (n / {d.lanes} + nth - 1) / nth * {d.lanes};
    long lo = tid * per, hi = lo + per < n ? lo + per : n;
    if (streaming) {{
      for (long i = lo; i < hi; i += {d.lanes}) VSTREAM(y + i, VLOAD(x + i));
      VSFENCE();
    }} else {{
      for (long i = lo; i < hi; i += {d.lanes}) VSTORE(y + i, VLOAD(x + i));
    }}
  }}
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}}
"""


def measure_bandwidth_gbs(hw: HardwareSpec, threads: int = 1, mib: int = 128) -> float:
    """Memory bandwidth (GB/s, bytes read + written) of a STREAM-style copy of ``mib`` MiB
    per array (far beyond the caches) on ``threads`` threads: best of 5, the better of plain
    and streaming (non-temporal) stores."""

    d = dialect(hw.isa)
    fn = c_library(_copy_source(hw.isa), (*BASE_FLAGS, *d.flags, "-fopenmp")).function(
        "tc_copy", ("ptr", "ptr", "long", "int", "int"), "double")
    n = (mib << 20) // 4 // 16 * 16
    x = aligned_empty(n)
    y = aligned_empty(n)
    x[:] = 1.0
    y[:] = 0.0
    best = min(fn(x, y, n, threads, streaming)
               for streaming in (0, 1) for _ in range(5))
    return 8.0 * n / best / 1e9
