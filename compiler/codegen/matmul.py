"""C code for matmul and batch_matmul: BLIS-style packing, blocking and register micro-kernels.

The emitted translation unit has all shapes as compile-time constants and exports

* ``int tc_kernel(void **args)`` — arguments in :meth:`OpSignature.arguments` order; returns
  0, or 1 if the workspace could not be allocated;
* ``double tc_time(void **args, long iters)`` — seconds for ``iters`` back-to-back calls,
  so timing does not include Python call overhead.

Structure (per batch item): the cache blocks of the schedule's loop order, packing of A and B
into 64-byte-aligned, zero-padded panels (edge panels always, full panels when the schedule
packs), and an ``MR x NR`` micro-kernel that keeps its accumulators in named vector registers
for the whole ``kc`` loop. Partial tiles are computed into a local tile and merged with
scalar code, so every shape is handled without masking. Threads split row blocks
(``parallel=m``), column micro-panels (``parallel=n``) or batch items, with manual static
partitions and explicit barriers.
"""

from __future__ import annotations

from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import MatmulSchedule

ALIGN_FLOATS = 16  # 64 bytes


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _ukr(name: str, s: MatmulSchedule, d: IsaDialect, a_ps: str, a_rs: str, b_ps: str,
         b_aligned: bool, has_bias: bool, has_relu: bool) -> str:
    """One micro-kernel: element (r, p) of the A panel is a[p*a_ps + r*a_rs]."""
    mr, nv, lanes = s.mr, s.nr // d.lanes, d.lanes
    load = "VLOAD" if b_aligned else "VLOADU"
    lines = [
        f"static inline void {name}(long kc, "
        "const float *restrict a, const float *restrict b, float *restrict c, long ldc, "
        "int first, int last, const float *restrict bias) {",
    ]
    for r in range(mr):
        lines.append("  vec " + ", ".join(f"c{r}_{v} = VZERO()" for v in range(nv)) + ";")
    if s.unroll > 1:
        lines.append(f"#pragma GCC unroll {s.unroll}")
    lines.append("  for (long p = 0; p < kc; p++) {")
    lines.append(
        "    vec " + ", ".join(f"b{v} = {load}(b + p * ({b_ps}) + {v * lanes})" for v in range(nv))
        + ";"
    )
    for r in range(mr):
        fmas = " ".join(f"c{r}_{v} = VFMA(a{r}, b{v}, c{r}_{v});" for v in range(nv))
        lines.append(f"    {{ vec a{r} = VSET1(a[p * ({a_ps}) + {r} * ({a_rs})]); {fmas} }}")
    lines.append("  }")
    if has_bias:
        lines.append(
            "  vec bv[" + str(nv) + "]; if (last) { "
            + " ".join(f"bv[{v}] = VLOADU(bias + {v * lanes});" for v in range(nv)) + " }"
        )
    for r in range(mr):
        for v in range(nv):
            ptr = f"c + {r} * ldc + {v * lanes}"
            step = f"  {{ vec t = c{r}_{v}; if (!first) t = VADD(t, VLOADU({ptr}));"
            if has_bias or has_relu:
                step += " if (last) {"
                if has_bias:
                    step += f" t = VADD(t, bv[{v}]);"
                if has_relu:
                    step += " t = VRELU(t);"
                step += " }"
            step += f" VSTOREU({ptr}, t); }}"
            lines.append(step)
    lines.append("}")
    return "\n".join(lines)


def generate_matmul(op: OpSignature, s: MatmulSchedule, d: IsaDialect) -> str:
    """The C translation unit for ``op`` under schedule ``s`` (validated by the caller)."""
    dims = op.dims_dict
    M, N, K = dims["M"], dims["N"], dims["K"]
    batch = op.batch
    mr, nr = s.mr, s.nr
    kc = min(s.kc, K)
    mc = min(s.mc, _round_up(M, mr))
    nc = min(s.nc, _round_up(N, nr))
    threads = s.threads
    par = s.parallel
    # A threaded kernel whose parallel axis is batch runs a serial body per batch item.
    body_threads = 1 if par == "batch" else threads
    has_bias = "bias" in op.epilogue
    has_relu = "relu" in op.epilogue
    # op(A)[i, p] = A[i*ARS + p*APS]; op(B)[p, j] = B[p*BPS + j*BCS]
    a_rs, a_ps = (1, M) if op.trans_a else (K, 1)
    b_ps, b_cs = (1, K) if op.trans_b else (N, 1)
    a_batch = 0 if op.shared == "a" else M * K
    b_batch = 0 if op.shared == "b" else K * N
    c_batch = M * N

    a_block = _round_up(mc, mr) * kc
    b_block = _round_up(nc, nr) * kc
    edge_a, edge_b, ctile = mr * kc, kc * nr, mr * nr
    shared_a = s.pack_a == 1 and par == "n"
    shared_b = s.pack_b == 1 and (par == "n" or (par == "m" and s.loop_order == "jpi"))
    if body_threads == 1:
        shared_a = shared_b = False

    def region(n: int) -> int:
        return _round_up(n, ALIGN_FLOATS)

    shared_floats = 0
    private_floats = 0
    layout_lines: list[str] = []
    offset_shared = 0
    offset_private = 0
    if s.pack_a:
        if shared_a:
            layout_lines.append(f"#define OFF_A_SHARED {offset_shared}L")
            offset_shared += region(a_block)
        else:
            layout_lines.append(f"#define OFF_A_PRIV {offset_private}L")
            offset_private += region(a_block)
    if s.pack_b:
        if shared_b:
            layout_lines.append(f"#define OFF_B_SHARED {offset_shared}L")
            offset_shared += region(b_block)
        else:
            layout_lines.append(f"#define OFF_B_PRIV {offset_private}L")
            offset_private += region(b_block)
    for name, size in (("EDGE_A", edge_a), ("EDGE_B", edge_b), ("CTILE", ctile)):
        layout_lines.append(f"#define OFF_{name} {offset_private}L")
        offset_private += region(size)
    shared_floats, private_floats = offset_shared, offset_private

    # Constant-B pre-packing: the whole op(B) laid out block by block, (jc, pc) in loop
    # order, exactly as the kernel would pack it; only when every batch item shares B.
    prepack = bool(s.pack_b) and (batch == 1 or op.shared == "b")
    nc_padded = _round_up(nc, nr)
    packed_floats = sum(_round_up(min(nc, N - j), nr) * K for j in range(0, N, nc))

    out: list[str] = []
    out.append(d.prelude)
    out.append(
        "#include <stdlib.h>\n#include <string.h>\n#include <time.h>\n"
        "#ifdef _OPENMP\n#include <omp.h>\n#endif\n"
    )
    out.append(
        f"#define M {M}L\n#define N {N}L\n#define K {K}L\n#define BATCH {batch}L\n"
        f"#define MR {mr}L\n#define NR {nr}L\n#define KC {kc}L\n#define MC {mc}L\n#define NC {nc}L\n"
        f"#define ARS {a_rs}L\n#define APS {a_ps}L\n#define BPS {b_ps}L\n#define BCS {b_cs}L\n"
        f"#define A_BATCH {a_batch}L\n#define B_BATCH {b_batch}L\n#define C_BATCH {c_batch}L\n"
        f"#define SHARED_FLOATS {shared_floats}L\n#define PRIVATE_FLOATS {private_floats}L\n"
        f"#define NC_PADDED {nc_padded}L\n#define B_PACKED_FLOATS {packed_floats}L\n"
        + "\n".join(layout_lines) + "\n"
        "#define MIN(x, y) ((x) < (y) ? (x) : (y))\n"
    )
    if body_threads > 1:
        out.append("#define BARRIER() _Pragma(\"omp barrier\")")
    else:
        out.append("#define BARRIER() ((void)0)")
    out.append(_WORKSPACE)

    # Packing: panels of MR rows of op(A) / NR columns of op(B), zero-padded, k-major.
    out.append(
        """\
static void pack_a_panel(float *restrict dst, const float *restrict a, long m_cur, long k_cur) {
  /* a points at op(A)[i0, p0] */
  if (APS == 1) {
    for (long r = 0; r < m_cur; r++)
      for (long p = 0; p < k_cur; p++) dst[p * MR + r] = a[r * ARS + p];
  } else {
    for (long p = 0; p < k_cur; p++)
      for (long r = 0; r < m_cur; r++) dst[p * MR + r] = a[r * ARS + p * APS];
  }
  if (m_cur < MR)
    for (long p = 0; p < k_cur; p++)
      for (long r = m_cur; r < MR; r++) dst[p * MR + r] = 0.0f;
}

static void pack_b_panel(float *restrict dst, const float *restrict b, long n_cur, long k_cur) {
  /* b points at op(B)[p0, j0] */
  if (BCS == 1) {
    for (long p = 0; p < k_cur; p++) {
      long q = 0;
      for (; q < n_cur; q++) dst[p * NR + q] = b[p * BPS + q];
      for (; q < NR; q++) dst[p * NR + q] = 0.0f;
    }
  } else {
    for (long q = 0; q < n_cur; q++)
      for (long p = 0; p < k_cur; p++) dst[p * NR + q] = b[q * BCS + p * BPS];
    if (n_cur < NR)
      for (long p = 0; p < k_cur; p++)
        for (long q = n_cur; q < NR; q++) dst[p * NR + q] = 0.0f;
  }
}

/* Pack panels [lo, hi) of the m_cur x k_cur block of op(A) at (i0, p0). */
static void pack_a_block(float *restrict dst, const float *restrict A, long i0, long m_cur,
                         long p0, long k_cur, long lo, long hi) {
  for (long t = lo; t < hi; t++) {
    long i = t * MR;
    pack_a_panel(dst + t * MR * k_cur, A + (i0 + i) * ARS + p0 * APS, MIN(MR, m_cur - i), k_cur);
  }
}

static void pack_b_block(float *restrict dst, const float *restrict B, long p0, long k_cur,
                         long j0, long n_cur, long lo, long hi) {
  for (long t = lo; t < hi; t++) {
    long j = t * NR;
    pack_b_panel(dst + t * NR * k_cur, B + p0 * BPS + (j0 + j) * BCS, MIN(NR, n_cur - j), k_cur);
  }
}
"""
    )
    # Micro-kernel variants: packed A/B, or read in place (full panels only).
    variants = [("ukr_pp", "MR", "1", "NR", True)]
    if s.pack_a == 0:
        variants.append(("ukr_dp", "APS", "ARS", "NR", True))
    if s.pack_b == 0:
        variants.append(("ukr_pd", "MR", "1", "BPS", False))
    if s.pack_a == 0 and s.pack_b == 0:
        variants.append(("ukr_dd", "APS", "ARS", "BPS", False))
    for name, aps, ars, bps, aligned in variants:
        out.append(_ukr(name, s, d, aps, ars, bps, aligned, has_bias, has_relu))

    bias_term = "if (bias) v += bias[j + q];" if has_bias else ""
    relu_term = "if (v < 0.0f) v = 0.0f;" if has_relu else ""
    out.append(
        f"""\
static void merge_tile(float *restrict c, const float *restrict t, long m_cur, long n_cur,
                       int first, int last, const float *restrict bias, long j) {{
  (void)bias; (void)j;
  for (long r = 0; r < m_cur; r++)
    for (long q = 0; q < n_cur; q++) {{
      float v = t[r * NR + q];
      if (!first) v += c[r * N + q];
      if (last) {{ {bias_term} {relu_term} }}
      c[r * N + q] = v;
    }}
}}
"""
    )
    # Block compute: micro-panels [jr_lo, jr_hi) of the block at (i0, j0, p0).
    a_full = "Ap + ir * MR * k_cur" if s.pack_a else "A + (i0 + ir * MR) * ARS + p0 * APS"
    b_full = "Bp + jr * NR * k_cur" if s.pack_b else "B + p0 * BPS + (j0 + jr * NR) * BCS"
    a_edge_src = "Ap + ir * MR * k_cur" if s.pack_a else "ea"
    b_edge_src = "Bp + jr * NR * k_cur" if s.pack_b else "eb"
    edge_a_pack = "" if s.pack_a else (
        "if (m_full < mp) pack_a_panel(ea, A + (i0 + m_full * MR) * ARS + p0 * APS, "
        "m_cur - m_full * MR, k_cur);")
    edge_b_pack = "" if s.pack_b else (
        "if (n_full < np && jr_hi == np) pack_b_panel(eb, B + p0 * BPS + (j0 + n_full * NR) * BCS, "
        "n_cur - n_full * NR, k_cur);")
    out.append(
        f"""\
static void compute_block(float *restrict C, const float *restrict A, const float *restrict B,
                          const float *restrict bias, const float *restrict Ap,
                          const float *restrict Bp, float *restrict priv, long i0, long m_cur,
                          long j0, long n_cur, long p0, long k_cur, int first, int last,
                          long jr_lo, long jr_hi) {{
  (void)A; (void)B; (void)Ap; (void)Bp;
  const long mp = (m_cur + MR - 1) / MR, np = (n_cur + NR - 1) / NR;
  const long m_full = m_cur / MR, n_full = n_cur / NR;
  float *ea = priv + OFF_EDGE_A, *eb = priv + OFF_EDGE_B, *ct = priv + OFF_CTILE;
  (void)ea; (void)eb;
  {edge_a_pack}
  {edge_b_pack}
  for (long jr = jr_lo; jr < jr_hi; jr++) {{
    const long j = j0 + jr * NR;
    const long n_here = MIN(NR, n_cur - jr * NR);
    const float *bias_j = {"bias + j" if has_bias else "bias"};
    for (long ir = 0; ir < mp; ir++) {{
      const long i = i0 + ir * MR;
      const long m_here = MIN(MR, m_cur - ir * MR);
      float *c = C + i * N + j;
      if (ir < m_full && jr < n_full) {{
        {_call_full(s)}
      }} else {{
        const float *a = ir < m_full ? {a_full} : {a_edge_src};
        const float *b = jr < n_full ? {b_full} : {b_edge_src};
        {_call_edge(s)}
        merge_tile(c, ct, m_here, n_here, first, last, bias, j);
      }}
    }}
  }}
}}
"""
    )
    out.append(_gemm_body(s, par, body_threads))
    out.append(_entry(op, s, has_bias, threads, par, prepack))
    return "\n".join(out)


def _call_full(s: MatmulSchedule) -> str:
    a = "Ap + ir * MR * k_cur" if s.pack_a else "A + i * ARS + p0 * APS"
    b = "Bp + jr * NR * k_cur" if s.pack_b else "B + p0 * BPS + j * BCS"
    name = "ukr_" + ("p" if s.pack_a else "d") + ("p" if s.pack_b else "d")
    return f"{name}(k_cur, {a}, {b}, c, N, first, last, bias_j);"


def _call_edge(s: MatmulSchedule) -> str:
    # Edge tiles: at least one operand comes from a packed edge panel. When an operand is
    # read in place for a full panel and the other is an edge, the matching mixed variant is
    # used; the tile goes to the local buffer `ct` and is merged by scalar code.
    if s.pack_a and s.pack_b:
        return "ukr_pp(k_cur, a, b, ct, NR, 1, 0, bias_j);"
    lines = []
    a_direct = "ir < m_full" if not s.pack_a else "0"
    b_direct = "jr < n_full" if not s.pack_b else "0"
    combos = {
        ("0", "0"): "ukr_pp",
        ("1", "0"): "ukr_dp",
        ("0", "1"): "ukr_pd",
        ("1", "1"): "ukr_dd",
    }
    for (ad, bd), name in combos.items():
        if (ad == "1" and s.pack_a) or (bd == "1" and s.pack_b):
            continue
        cond_a = a_direct if ad == "1" else f"!({a_direct})"
        cond_b = b_direct if bd == "1" else f"!({b_direct})"
        lines.append(f"if (({cond_a}) && ({cond_b})) {name}(k_cur, a, b, ct, NR, 1, 0, bias_j);")
    return "\n        ".join(lines)


_WORKSPACE = """\
/* One workspace per calling thread, grown on demand and reused across calls. */
static __thread float *tc_ws = NULL;
static __thread size_t tc_ws_cap = 0;
static float *tc_workspace(size_t floats) {
  if (floats == 0) floats = 16;
  if (floats > tc_ws_cap) {
    free(tc_ws);
    size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    tc_ws = (float *)aligned_alloc(64, bytes);
    tc_ws_cap = tc_ws ? floats : 0;
  }
  return tc_ws;
}

static void split_range(long n, int tid, int nth, long *lo, long *hi) {
  long base = n / nth, extra = n % nth;
  *lo = tid * base + (tid < extra ? tid : extra);
  *hi = *lo + base + (tid < extra ? 1 : 0);
}
"""


def _gemm_body(s: MatmulSchedule, par: str, threads: int) -> str:
    """The blocked loops for one batch item, run by every thread of the team."""
    a_buf = ("shared + OFF_A_SHARED" if (s.pack_a and par == "n" and threads > 1)
             else "priv + OFF_A_PRIV" if s.pack_a else "NULL")
    if s.pack_b and threads > 1 and (par == "n" or (par == "m" and s.loop_order == "jpi")):
        b_buf = "shared + OFF_B_SHARED"
    else:
        b_buf = "priv + OFF_B_PRIV" if s.pack_b else "NULL"
    split_m = par == "m" and threads > 1
    split_n = par == "n" and threads > 1
    head = """\
static void gemm_body(const float *restrict A, const float *restrict B, const float *restrict bias,
                      float *restrict C, float *shared, float *priv, int tid, int nth,
                      const float *Bpre) {
  /* Bpre: op(B) already packed (tc_pack_weights), or NULL to pack blocks here */
  (void)shared; (void)tid; (void)nth; (void)Bpre;
"""
    lines = [head, f"  float *Ap = {a_buf}; float *Bp = {b_buf}; (void)Ap; (void)Bp;",
             "  const float *Bu = Bp; (void)Bu;"]
    lines.append("  const long nblk_m = (M + MC - 1) / MC;\n  (void)nblk_m;")

    def pack_a(ind: str) -> str:
        if not s.pack_a:
            return ""
        if split_n:
            return (f"{ind}{{ long lo, hi; split_range((m_cur + MR - 1) / MR, tid, nth, &lo, &hi);"
                    f" pack_a_block(Ap, A, ic, m_cur, pc, k_cur, lo, hi); }}\n{ind}BARRIER();\n")
        return f"{ind}pack_a_block(Ap, A, ic, m_cur, pc, k_cur, 0, (m_cur + MR - 1) / MR);\n"

    def pack_b(ind: str, split: bool) -> str:
        if not s.pack_b:
            return ""
        if split:
            pack = ("{ long lo, hi; split_range((n_cur + NR - 1) / NR, tid, nth, &lo, &hi);"
                    " pack_b_block(Bp, B, pc, k_cur, jc, n_cur, lo, hi); } BARRIER();")
        else:
            pack = "pack_b_block(Bp, B, pc, k_cur, jc, n_cur, 0, (n_cur + NR - 1) / NR);"
        # Every thread takes the same branch (Bpre is the same for all), so the barrier holds.
        return (f"{ind}if (Bpre) Bu = Bpre + (jc / NC) * NC_PADDED * K"
                f" + (n_cur + NR - 1) / NR * NR * pc;\n"
                f"{ind}else {{ {pack} Bu = Bp; }}\n")

    def compute(ind: str) -> str:
        rng = ("{ long lo, hi; split_range((n_cur + NR - 1) / NR, tid, nth, &lo, &hi);"
               if split_n else "{ long lo = 0, hi = (n_cur + NR - 1) / NR;")
        return (f"{ind}{rng}\n{ind}  compute_block(C, A, B, bias, Ap, Bu, priv, ic, m_cur, jc, "
                f"n_cur, pc, k_cur, pc == 0, pc + KC >= K, lo, hi); }}\n")

    if s.loop_order == "jpi":
        body = "  for (long jc = 0; jc < N; jc += NC) {\n    const long n_cur = MIN(NC, N - jc);\n"
        body += "    for (long pc = 0; pc < K; pc += KC) {\n      const long k_cur = MIN(KC, K - pc);\n"
        body += pack_b("      ", threads > 1 and par in ("m", "n"))
        if split_m:
            body += ("      for (long bi = tid; bi < nblk_m; bi += nth) {\n"
                     "        const long ic = bi * MC, m_cur = MIN(MC, M - ic);\n")
        else:
            body += ("      for (long ic = 0; ic < M; ic += MC) {\n"
                     "        const long m_cur = MIN(MC, M - ic);\n")
        body += pack_a("        ")
        body += compute("        ")
        if split_n:
            body += "        BARRIER();\n"
        body += "      }\n"
        if split_m:
            body += "      BARRIER();\n"
        body += "    }\n  }\n"
    else:  # ipj
        if split_m:
            body = ("  for (long bi = tid; bi < nblk_m; bi += nth) {\n"
                    "    const long ic = bi * MC, m_cur = MIN(MC, M - ic);\n")
        else:
            body = "  for (long ic = 0; ic < M; ic += MC) {\n    const long m_cur = MIN(MC, M - ic);\n"
        body += "    for (long pc = 0; pc < K; pc += KC) {\n      const long k_cur = MIN(KC, K - pc);\n"
        body += pack_a("      ")
        body += "      for (long jc = 0; jc < N; jc += NC) {\n        const long n_cur = MIN(NC, N - jc);\n"
        body += pack_b("        ", split_n)
        body += compute("        ")
        if split_n:
            body += "        BARRIER();\n"
        body += "      }\n    }\n  }\n"
    lines.append(body)
    lines.append("}\n")
    return "\n".join(lines)


def _entry(op: OpSignature, s: MatmulSchedule, has_bias: bool, threads: int, par: str,
           prepack: bool = False) -> str:
    """``tc_kernel`` and ``tc_time``; with ``prepack``, also the pre-packed-B ABI.

    ``tc_pack_weights(B, Bw)`` writes op(B) block by block in the kernel's panel layout
    (``tc_packed_weights_floats()`` floats, 64-byte aligned); ``tc_kernel_packed`` takes
    ``tc_kernel``'s arguments with that buffer in B's place and packs nothing of B.
    """
    out = [_entry_function(op, "tc_kernel", has_bias, threads, par, packed=False), _TIMER]
    if prepack:
        out.append(_entry_function(op, "tc_kernel_packed", has_bias, threads, par, packed=True))
        out.append("""\
long tc_packed_weights_floats(void) { return B_PACKED_FLOATS; }

void tc_pack_weights(const float *B, float *Bw) {
  for (long jc = 0; jc < N; jc += NC) {
    const long n_cur = MIN(NC, N - jc);
    for (long pc = 0; pc < K; pc += KC)
      pack_b_block(Bw + (jc / NC) * NC_PADDED * K + (n_cur + NR - 1) / NR * NR * pc, B, pc,
                   MIN(KC, K - pc), jc, n_cur, 0, (n_cur + NR - 1) / NR);
  }
}
""")
        out.append(_TIMER_PACKED)
    return "".join(out)


_TIMER = """
double tc_time(void **args, long iters) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < iters; i++) tc_kernel(args);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}
"""
_TIMER_PACKED = _TIMER.replace("tc_time(", "tc_time_packed(").replace(
    "tc_kernel(args)", "tc_kernel_packed(args)")


def _entry_function(op: OpSignature, name: str, has_bias: bool, threads: int, par: str,
                    packed: bool) -> str:
    bias_arg = "(const float *)args[2]" if has_bias else "NULL"
    c_index = 3 if has_bias else 2
    # Packed: args[1] is the pre-packed op(B), which the body reads instead of B.
    b_arg, pre = ("NULL", "(const float *)args[1]") if packed else ("(const float *)args[1]",
                                                                    "NULL")
    b_at = "B" if packed else "B + b * B_BATCH"
    head = f"""\
int {name}(void **args) {{
  const float *A = (const float *)args[0], *B = {b_arg}, *Bpre = {pre};
  const float *bias = {bias_arg};
  float *C = (float *)args[{c_index}];
  (void)bias; (void)Bpre;
"""
    if threads == 1:
        body = f"""\
  float *ws = tc_workspace(SHARED_FLOATS + PRIVATE_FLOATS);
  if (!ws) return 1;
  for (long b = 0; b < BATCH; b++)
    gemm_body(A + b * A_BATCH, {b_at}, bias, C + b * C_BATCH, ws, ws + SHARED_FLOATS, 0, 1, Bpre);
  return 0;
}}
"""
    else:
        loop = (
            "    for (long b = tid; b < BATCH; b += nth)\n"
            f"      gemm_body(A + b * A_BATCH, {b_at}, bias, C + b * C_BATCH, ws, priv, 0, 1, Bpre);\n"
            if par == "batch"
            else
            "    for (long b = 0; b < BATCH; b++)\n"
            f"      gemm_body(A + b * A_BATCH, {b_at}, bias, C + b * C_BATCH, ws, priv, tid, nth, "
            "Bpre);\n"
        )
        body = (
            f"  float *ws = tc_workspace(SHARED_FLOATS + {threads}L * PRIVATE_FLOATS);\n"
            "  if (!ws) return 1;\n"
            f"#pragma omp parallel num_threads({threads})\n"
            "  {\n"
            "    int tid = omp_get_thread_num(), nth = omp_get_num_threads();\n"
            "    float *priv = ws + SHARED_FLOATS + tid * PRIVATE_FLOATS;\n"
            + loop + "  }\n  return 0;\n}\n"
        )
    return head + body
