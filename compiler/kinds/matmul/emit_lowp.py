"""Low-precision matmul kernels: ``int8`` (u8 A times s8 B, exact int32 C) and ``bf16``
(bfloat16 A and B, float32 accumulation and C).

Written in the dialect's dot-product vocabulary for the dtype (``IsaDialect.int8`` or
``IsaDialect.bf16``; see :mod:`tunecache.compiler.codegen.isa`): VNNI's four K elements a
step or 16-bit pairs for int8, AVX512-BF16's pairs or widening FMAs for bf16, per the CPU's
features. Each call packs A's rows zero-padded to whole K groups and B into ``[K groups][N
padded][IGROUP]`` of the vocabulary's ``ib_t`` (the layout one ``IDOT`` reads for a vector of
columns; constant weights are packed once, ``tc_pack_weights``), then each thread takes row
tiles of ``mr`` rows, and for each block of ``nc`` columns (whose packed B the block's row
tiles share in L2) sweeps its ``nr``-column panels with ``mr x nr / lanes`` accumulators.
With ``a_type=float32`` the A packing converts float32 rows (quantizing to u8 with ``qa``,
or rounding to bfloat16), so the activations are read once, as they are; the epilogue
(``dequant``, ``bias``, an activation) runs on each tile row's accumulators once, as scalar
C over a row of ``nr`` that the compiler vectorises.
The knobs are the float32 schedule's ``mr``, ``nr``, ``nc`` and ``threads``; ``kc``, ``mc``,
A packing, Strassen and loop orders do not apply (``gemm_problems``).
"""

from __future__ import annotations

from tunecache.compiler.codegen.abi import PackedWeights, kernel_entries, preamble
from tunecache.compiler.codegen.epilogue import CHANNEL_OPERAND, render, scalar_helpers
from tunecache.compiler.codegen.isa import BF16_SCALAR, IsaDialect
from tunecache.compiler.kinds import narrow_tensors
from tunecache.compiler.kinds.matmul.emit_tiles import (
    TILE_PACK_B,
    TILE_ROWS,
    TILE_SIZES,
    tile_rows,
)
from tunecache.compiler.kinds.matmul.space import MatmulSchedule
from tunecache.compiler.ops import OpSignature


def float_a(op: OpSignature) -> bool:
    """Whether the kernel takes A as float32 and converts it (``a_type`` float32 or
    dynamic)."""
    return dict(op.attrs).get("a_type") in ("float32", "dynamic")


def dynamic_a(op: OpSignature) -> bool:
    """Whether the kernel quantizes A with parameters of A's own range (``a_type=dynamic``)."""
    return dict(op.attrs).get("a_type") == "dynamic"


TYPES = {"int8": ("uint8_t", "int8_t", "int32_t"), "bf16": ("uint16_t", "uint16_t", "float")}
"""C types of A (as packed), B (as the caller holds it) and the accumulators, per dtype."""

_COPY_ROW = """    memcpy(Ap + i * KP, (const ta_t *)A + i * K, K * sizeof(ta_t));"""
_QUANTIZE_ROW = """\
    /* Saturate x / scale to [-z, 255 - z] (NaN to -z), round half to even by adding and
       taking away 1.5 * 2**23, add z: whole vectors, no libm call (restrict: the uint8
       stores could alias anything). */
    const float *restrict x = (const float *)A + i * K;
    ta_t *restrict row = Ap + i * KP;
    const float scale = qa[0], z = qa[1], lo = -z, hi = 255.0f - z;
    for (long k = 0; k < K; k++) {
      float v = x[k] / scale;
      v = v >= lo ? v : lo;
      v = v <= hi ? v : hi;
      v = (v + 12582912.0f) - 12582912.0f;
      row[k] = (ta_t)(int)(v + z);
    }"""
_ROUND_ROW = """\
    const uint32_t *restrict x = (const uint32_t *)A + i * K;
    ta_t *restrict row = Ap + i * KP;
    long k = 0;
    for (; k + LANES <= K; k += LANES) VSTORE_BF16(row + k, VLOADU((const float *)x + k));
    for (; k < K; k++)
      row[k] = (ta_t)((x[k] + 0x7FFFu + ((x[k] >> 16) & 1u)) >> 16);"""
_PACK_A = """/* A's rows [lo, hi) into KP-element rows, zero-padded past K. */
static void tc_lowp_pack_a(const void *A, const float *qa, ta_t *Ap, long lo, long hi) {
  (void)qa;
  for (long i = lo; i < hi; i++) {
%s
    memset(Ap + i * KP + K, 0, (KP - K) * sizeof(ta_t));
  }
}
"""

_PACK_B = """\
/* B (K x N) into [K groups][NP][IGROUP] of ib_t, zero-padded: groups [g0, g1). */
static void tc_lowp_pack_b(const tb_t *Bs, ib_t *Bp, long g0, long g1) {
  for (long g = g0; g < g1; g++)
    for (long n = 0; n < NP; n++)
      for (long t = 0; t < IGROUP; t++) {
        const long k = g * IGROUP + t;
        Bp[(g * NP + n) * IGROUP + t] = (k < K && n < N) ? IB_FROM(Bs[k * N + n]) : 0;
      }
}
"""

_BODY = """\
  ta_t *Ap = (ta_t *)ws;
  long lo, hi;
  split_range(M, TID, NTH, &lo, &hi);
{prepare}
{weights}
  BARRIER();
{start}{split}
{end}"""
_SPLIT_ROWS = """  split_range((M + MR - 1) / MR, TID, NTH, &lo, &hi);
  for (long j0 = 0; j0 < NP; j0 += NC)
    for (long tile = lo; tile < hi; tile++)
      tc_lowp_rows(Ap, Bp, (tc_t *)C, {scale}, {bias}, chan, tile * MR, j0, MIN(NP, j0 + NC));"""
# parallel=n: each thread its own share of B's panels (all of A's rows), so of the weights
# streamed from memory
_SPLIT_COLUMNS = """  split_range(NP / NR, TID, NTH, &lo, &hi);
  for (long j0 = lo * NR; j0 < hi * NR; j0 += NC)
    for (long tile = 0; tile < (M + MR - 1) / MR; tile++)
      tc_lowp_rows(Ap, Bp, (tc_t *)C, {scale}, {bias}, chan, tile * MR, j0, MIN(hi * NR, j0 + NC));"""
_PREPARE = "  tc_lowp_pack_a(A, qa, Ap, lo, hi);"
_PREPARE_DYNAMIC = """\
  /* A's range over every thread's rows, then its parameters, its rows quantized with them
     and the epilogue's per-column scale and bias scaled by them. */
  float *part = (float *)((char *)ws + A_BYTES), *dq = part + 2 * TEAM;
  tc_lowp_range((const float *)A, lo, hi, part + 2 * TID);
  BARRIER();
  float dqa[2];
  tc_lowp_dynamic(part, NTH, dqa);
  tc_lowp_pack_a(A, dqa, Ap, lo, hi);
  {
    long c0, c1;
    split_range(N, TID, NTH, &c0, &c1);
    for (long n = c0; n < c1; n++) {
      dq[n] = dqa[0] * scale[n];
      dq[N + n] = bias[n] - dqa[0] * dqa[1] * zsum[n];
    }
  }"""
_DYNAMIC = """\
/* The smallest and largest of A's rows [lo, hi) and 0, into out[0], out[1]. */
static void tc_lowp_range(const float *A, long lo, long hi, float *out) {
  vec mn = VZERO(), mx = VZERO();
  long i = lo * K;
  for (; i + LANES <= hi * K; i += LANES) {
    const vec v = VLOADU(A + i);
    mn = VMIN(mn, v);
    mx = VMAX(mx, v);
  }
  float fmn = -VHMAX(VNEG(mn)), fmx = VHMAX(mx);
  for (; i < hi * K; i++) {
    fmn = A[i] < fmn ? A[i] : fmn;
    fmx = A[i] > fmx ? A[i] : fmx;
  }
  out[0] = fmn;
  out[1] = fmx;
}

/* DynamicQuantizeLinear's scale and zero point from the threads' ranges. */
static void tc_lowp_dynamic(const float *part, int nth, float *out) {
  float lo = 0.0f, hi = 0.0f;
  for (int t = 0; t < nth; t++) {
    lo = part[2 * t] < lo ? part[2 * t] : lo;
    hi = part[2 * t + 1] > hi ? part[2 * t + 1] : hi;
  }
  const float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
  float z = 0.0f - lo / scale;
  z = z > 0.0f ? (z < 255.0f ? z : 255.0f) : 0.0f;
  out[0] = scale;
  out[1] = (z + 12582912.0f) - 12582912.0f;
}
"""
_PACK_PER_CALL = """\
  ib_t *Bp = (ib_t *)((char *)ws + A_BYTES + DYN_BYTES);
  split_range(KG, TID, NTH, &lo, &hi);
  tc_lowp_pack_b((const tb_t *)B, Bp, lo, hi);"""
_PACKED_ONCE = "  const ib_t *Bp = (const ib_t *)B;"


def narrow_c(op: OpSignature) -> bool:
    """Whether ``op`` stores C as bfloat16 (``narrow=y``; kinds sharing matmul's arguments
    without the attribute never do)."""
    return "y" in narrow_tensors(op)


def _finish(op: OpSignature) -> str:
    """``tc_lowp_finish``: one tile row's accumulators, epilogue applied, into C: whole
    vectors of the accumulators as floats through the vector epilogue, then a scalar tail."""
    head = ("static inline void tc_lowp_finish(const tacc_t *acc, tc_t *c, long j, "
            "long width, const float *scale, const float *bias, const float *chan) {\n")
    if not op.epilogue and not narrow_c(op):
        return (head + "  (void)j; (void)scale; (void)bias; (void)chan;\n"
                "  memcpy(c, acc, (size_t)width * sizeof(tc_t));\n}\n")
    # C as bfloat16 (narrow=y): the rounding of VSTORE_BF16, one scalar for the tail
    store, last = (("VSTORE_BF16(c + t, v)", "c[t] = tc_bf16_round(v)") if narrow_c(op)
                   else ("VSTOREU(c + t, v)", "c[t] = v"))
    vector = render(op.epilogue, "v", {"scale": "VLOADU(scale + j + t)",
                                       "bias": "VLOADU(bias + j + t)",
                                       CHANNEL_OPERAND: "VLOADU(chan + {i} * N + j + t)"},
                    vector=True)
    scalar = render(op.epilogue, "v", {"scale": "scale[j + t]", "bias": "bias[j + t]",
                                       CHANNEL_OPERAND: "chan[{i} * N + j + t]"}, vector=False)
    return (head + "  (void)scale; (void)bias; (void)chan;\n"
            "  float f[NR] __attribute__((aligned(64)));\n"
            "  for (long t = 0; t < NR; t++) f[t] = (float)acc[t];\n"
            "  long t = 0;\n"
            f"  for (; t + LANES <= width; t += LANES) {{\n    vec v = VLOAD(f + t);\n"
            f"    {vector}\n    {store};\n  }}\n"
            f"  for (; t < width; t++) {{\n    float v = f[t];\n    {scalar}\n    {last};\n"
            "  }\n}\n")


def _rows(mr: int, nv: int) -> str:
    """``tc_lowp_rows``: rows ``i0 .. i0 + MR`` of C (those below M), panels j0 .. j1."""
    acc = [f"c{r}_{v}" for r in range(mr) for v in range(nv)]
    # B's vectors once a step, into registers, then each row's broadcast against them.
    loads = "".join(f"      const ibv_t b{v} = ILOADB(b + {v} * LANES * IGROUP);\n"
                    for v in range(nv))
    steps = [loads] + [f"      const ia_t a{r} = IBCAST(a_{r} + g * IGROUP);\n" + "".join(
        f"      c{r}_{v} = IDOT(c{r}_{v}, a{r}, b{v});\n" for v in range(nv))
        for r in range(mr)]
    stores = "".join(
        f"    if ({r} < rows) {{\n"
        + "".join(f"      ISTOREU(out + {v} * LANES, c{r}_{v});\n" for v in range(nv))
        + f"      tc_lowp_finish(out, C + (i0 + {r}) * N + j, j, width, scale, bias, chan);\n"
        "    }\n"
        for r in range(mr))
    return (
        "static void tc_lowp_rows(const ta_t *Ap, const ib_t *Bp, tc_t *C, const float *scale,\n"
        "    const float *bias, const float *chan, long i0, long j0, long j1) {\n"
        "  const long rows = MIN(MR, M - i0);\n"
        + "".join(f"  const ta_t *a_{r} = Ap + MIN(i0 + {r}, M - 1) * KP;\n"
                  for r in range(mr))
        + "  tacc_t out[NR] __attribute__((aligned(64)));\n"
        "  for (long j = j0; j < j1; j += NR) {\n"
        f"    ivec {', '.join(f'{c} = IZERO()' for c in acc)};\n"
        "    const ib_t *b = Bp + j * IGROUP;\n"
        "    for (long g = 0; g < KG; g++, b += NP * IGROUP) {\n"
        + "".join(steps) + "    }\n"
        "    const long width = MIN(NR, N - j);\n"
        + stores + "  }\n}\n")


def generate_lowp(op: OpSignature, s: MatmulSchedule, d: IsaDialect) -> str:
    """The kernel of a low-precision ``op`` under ``s`` in dialect ``d`` (schedule legal)."""
    nv = s.nr // d.lanes
    m, n, k = op.dim("M"), op.dim("N"), op.dim("K")
    np_ = -(-n // s.nr) * s.nr
    constants = {"M": m, "N": n, "K": k, "MR": s.mr, "NR": s.nr, "LANES": d.lanes, "NP": np_,
                 "NC": min(s.nc, np_), "TEAM": s.threads}
    dynamic = dynamic_a(op)
    ta, tb, tacc = TYPES[op.dtype]
    tc = "uint16_t" if narrow_c(op) else "float" if "dequant" in op.epilogue else tacc
    tiles = s.loop_order == "amx"
    vocabulary = (d.int8 if op.dtype == "int8" else d.bf16) + d.tile_vocabulary(op.dtype) * tiles
    sizes = (f"typedef {ta} ta_t;\ntypedef {tb} tb_t;\ntypedef {tacc} tacc_t;\n"
             f"typedef {tc} tc_t;\n"
             + (TILE_SIZES if tiles else
                "#define KG ((K + IGROUP - 1) / IGROUP)\n#define KP (KG * IGROUP)\n"
                # (+ 4: IBCAST may read a whole group's word past the last pair)
                "#define A_BYTES ((M * KP * (long)sizeof(ta_t) + 4 + 63) / 64 * 64)\n")
             + "#define B_BYTES (KG * NP * IGROUP * (long)sizeof(ib_t))\n"
             "#define DYN_BYTES " + ("(((2 * TEAM + 2 * N) * 4 + 63) / 64 * 64)\n"
                                     if dynamic else "0\n"))
    packed = PackedWeights("((B_BYTES + 3) / 4)",
                           "  tc_lowp_pack_b((const tb_t *)weights, (ib_t *)packed, 0, KG);")

    def body(once: bool) -> str:
        split = (_SPLIT_COLUMNS if s.parallel == "n" else _SPLIT_ROWS).format(
            scale="dq" if dynamic else "scale", bias="dq + N" if dynamic else "bias")
        return _BODY.format(prepare=_PREPARE_DYNAMIC if dynamic else _PREPARE,
                            weights=_PACKED_ONCE if once else _PACK_PER_CALL, split=split,
                            start="  TCONFIG();\n" if tiles else "",
                            end="  TRELEASE();\n" if tiles else "")

    return "\n".join([
        preamble(d, constants, s.threads), "#include <stdint.h>\n#include <math.h>",
        vocabulary, sizes, scalar_helpers(op.epilogue), BF16_SCALAR if narrow_c(op) else "",
        _PACK_A % _a_row(op),
        TILE_PACK_B if tiles else _PACK_B,
        _DYNAMIC if dynamic else "", _finish(op),
        tile_rows(s.mr // TILE_ROWS, s.nr // TILE_ROWS) if tiles else _rows(s.mr, nv),
        kernel_entries(op, body, threads=s.threads,
                       ws_floats="((A_BYTES + DYN_BYTES + B_BYTES + 3) / 4)",
                       packed=packed, packed_ws_floats="((A_BYTES + DYN_BYTES + 3) / 4)",
                       optional=("qa", "scale", "bias", "zsum", CHANNEL_OPERAND)),
    ])


def _a_row(op: OpSignature) -> str:
    """C copying (or, for float32 A, converting) A's row ``i`` into ``Ap``."""
    if not float_a(op):
        return _COPY_ROW
    return _QUANTIZE_ROW if op.dtype == "int8" else _ROUND_ROW
