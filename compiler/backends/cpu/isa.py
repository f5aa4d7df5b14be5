"""The x86 dialects kind emitters write in: AVX-512 and AVX2 with Intel intrinsics, and the
portable vector-extension dialect built for x86-64 (the vocabulary is documented in
:mod:`tunecache.compiler.codegen.isa`), with the compiler flags that select each ISA level."""

from __future__ import annotations

import functools
import platform
from dataclasses import replace

from tunecache.compiler.codegen.isa import (
    BF16_BY_FMA,
    EXP_CONSTANTS,
    LOG,
    LOG_CONSTANTS,
    SCALAR_EXP,
    TANH_ERF,
    IsaDialect,
    portable_dialect,
)
from tunecache.compiler.hardware import PORTABLE_ISA, IsaLevel, register_isa_level

# Never -ffast-math: a shared object built with it switches FTZ/DAZ on for the whole process.
# ISO dialects (-std=c11) disable FMA contraction, so use the GNU dialect and ask for it.
# Loops start on a cache line: where GCC's default 16-byte alignment leaves a micro-kernel's
# loop straddling one more 64-byte line, the same kernel runs 5-8% slower on Zen 3 (ARCHITECTURE
# change 64), so without it a kernel's speed depends on the code placed before it.
BASE_FLAGS = ("-O3", "-std=gnu11", "-fPIC", "-shared", "-ffp-contract=fast", "-fno-math-errno",
              "-falign-loops=64")


_AVX512_PRELUDE = """\
#include <immintrin.h>
typedef __m512 vec;
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_load_ps(p)
#define VLOADU(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_store_ps((p), (v))
#define VSTOREU(p, v) _mm512_storeu_ps((p), (v))
#define VSET1(x) _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VADD(a, b) _mm512_add_ps((a), (b))
#define VRELU(a) _mm512_max_ps(_mm512_setzero_ps(), (a))
"""

_AVX2_PRELUDE = """\
#include <immintrin.h>
typedef __m256 vec;
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_load_ps(p)
#define VLOADU(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_store_ps((p), (v))
#define VSTOREU(p, v) _mm256_storeu_ps((p), (v))
#define VSET1(x) _mm256_set1_ps(x)
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VADD(a, b) _mm256_add_ps((a), (b))
#define VRELU(a) _mm256_max_ps(_mm256_setzero_ps(), (a))
"""

_AVX512_MATH = EXP_CONSTANTS + """\
#define VMAX(a, b) _mm512_max_ps((a), (b))
#define VMIN(a, b) _mm512_min_ps((a), (b))
#define VMUL(a, b) _mm512_mul_ps((a), (b))
#define VSUB(a, b) _mm512_sub_ps((a), (b))
#define VDIV(a, b) _mm512_div_ps((a), (b))
#define VHSUM(v) _mm512_reduce_add_ps(v)
#define VHMAX(v) _mm512_reduce_max_ps(v)
#define VMAXN(a, b) tc_vmaxn((a), (b))
#define VMINN(a, b) tc_vminn((a), (b))
#define VHMAXN(v) tc_hmaxn(v)
#define VLOADU_PART(p, n) _mm512_maskz_loadu_ps(tc_part_mask(n), (p))
#define VSTOREU_PART(p, v, n) _mm512_mask_storeu_ps((p), tc_part_mask(n), (v))
#define VFILL_PART(v, n, x) _mm512_mask_blend_ps(tc_part_mask(n), _mm512_set1_ps(x), (v))
#define VEXP(x) tc_exp(x)
static inline __mmask16 tc_part_mask(int n) { return (__mmask16)((1u << n) - 1u); }
static inline __m512 tc_vmaxn(__m512 a, __m512 b) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), _mm512_max_ps(a, b), a);
}
static inline __m512 tc_vminn(__m512 a, __m512 b) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), _mm512_min_ps(a, b), a);
}
static inline float tc_hmaxn(__m512 v) {
  return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) ? __builtin_nanf("") : _mm512_reduce_max_ps(v);
}
static inline __m512 tc_exp(__m512 x) {
  const __m512 lo = _mm512_set1_ps(TC_EXP_LO);
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  const __mmask16 over = _mm512_cmp_ps_mask(x, _mm512_set1_ps(TC_EXP_OVER), _CMP_GT_OQ);
  x = _mm512_min_ps(_mm512_set1_ps(TC_EXP_HI), _mm512_max_ps(lo, x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(TC_LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(TC_LN2_HI), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(TC_LN2_LO), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(TC_EXP_P0), r, _mm512_set1_ps(TC_EXP_P1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TC_EXP_P2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TC_EXP_P3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TC_EXP_P4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TC_EXP_P5));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mask_blend_ps(over, _mm512_maskz_mul_ps((__mmask16)~under, p,
                              _mm512_castsi512_ps(e)), _mm512_set1_ps(__builtin_inff()));
}
"""

_AVX2_MATH = EXP_CONSTANTS + """\
#define VMAX(a, b) _mm256_max_ps((a), (b))
#define VMIN(a, b) _mm256_min_ps((a), (b))
#define VMUL(a, b) _mm256_mul_ps((a), (b))
#define VSUB(a, b) _mm256_sub_ps((a), (b))
#define VDIV(a, b) _mm256_div_ps((a), (b))
#define VHSUM(v) tc_hsum(v)
#define VHMAX(v) tc_hmax(v)
#define VMAXN(a, b) tc_vmaxn((a), (b))
#define VMINN(a, b) tc_vminn((a), (b))
#define VHMAXN(v) tc_hmaxn(v)
#define VLOADU_PART(p, n) _mm256_maskload_ps((p), tc_part_mask(n))
#define VSTOREU_PART(p, v, n) _mm256_maskstore_ps((p), tc_part_mask(n), (v))
#define VFILL_PART(v, n, x) \\
  _mm256_blendv_ps(_mm256_set1_ps(x), (v), _mm256_castsi256_ps(tc_part_mask(n)))
#define VEXP(x) tc_exp(x)
static inline __m256i tc_part_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline float tc_hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
static inline float tc_hmax(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}
static inline __m256 tc_vmaxn(__m256 a, __m256 b) {
  return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}
static inline __m256 tc_vminn(__m256 a, __m256 b) {
  return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}
static inline float tc_hmaxn(__m256 v) {
  return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) ? __builtin_nanf("") : tc_hmax(v);
}
static inline __m256 tc_exp(__m256 x) {
  const __m256 lo = _mm256_set1_ps(TC_EXP_LO);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  const __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(TC_EXP_OVER), _CMP_GT_OQ);
  x = _mm256_min_ps(_mm256_set1_ps(TC_EXP_HI), _mm256_max_ps(lo, x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(TC_LOG2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(TC_LN2_HI), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(TC_LN2_LO), r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(TC_EXP_P0), r, _mm256_set1_ps(TC_EXP_P1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TC_EXP_P2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TC_EXP_P3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TC_EXP_P4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TC_EXP_P5));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_blendv_ps(_mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e))),
                          _mm256_set1_ps(__builtin_inff()), over);
}
"""

# Element-wise activations and memory access patterns of the memory-bound kinds (pool2d,
# elementwise); see the module docstring.
_AVX512_MORE = """\
#define VNEG(a) _mm512_xor_ps((a), _mm512_set1_ps(-0.0f))
#define VABS(a) _mm512_abs_ps(a)
#define VSQRT(a) _mm512_sqrt_ps(a)
#define VSIGNOF(x, m) _mm512_or_ps((m), _mm512_and_ps((x), _mm512_set1_ps(-0.0f)))
#define VSEL_LT(x, y, a, b) _mm512_mask_blend_ps(_mm512_cmp_ps_mask((x), (y), _CMP_LT_OQ), (b), (a))
/* a 14-bit estimate and one Newton step, r + r (1 - x r): within 2 ulp, for a division's
   10-16 cycles */
static inline __m512 VRCP(__m512 x) {
  const __m512 r = _mm512_rcp14_ps(x);
  return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(x, r, _mm512_set1_ps(1.0f)), r);
}
#define VSTREAM(p, v) _mm512_stream_ps((p), (v))
#define VSFENCE() _mm_sfence()
#define VSTORE_U8(p, v) \
  _mm_storeu_si128((__m128i *)(void *)(p), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(v)))
#define VLOAD_U8(p) \
  _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))))
static inline void VSTORE_BF16(void *p, __m512 v) {
#ifdef __AVX512BF16__
  /* the instruction rounds to nearest even too (subnormals to zero) */
  _mm256_storeu_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh(v));
#else
  const __m512i b = _mm512_castps_si512(v), one = _mm512_set1_epi32(1);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), one);
  const __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
  _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
#endif
}
#define VLOAD_BF16(p) _mm512_castsi512_ps(_mm512_slli_epi32( \
  _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16))
#define VFLOOR(a) _mm512_roundscale_ps((a), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
/* the table in one register: a permute a lookup (NaN's index is 0x80000000: entry 0) */
#define VTABLE16(t, f) _mm512_permutexvar_ps(_mm512_cvttps_epi32(f), _mm512_load_ps(t))
static inline __m512 VLOADS2(const float *p) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  return _mm512_permutex2var_ps(_mm512_loadu_ps(p), even, _mm512_loadu_ps(p + 16));
}
"""

_AVX2_MORE = """\
#define VNEG(a) _mm256_xor_ps((a), _mm256_set1_ps(-0.0f))
#define VABS(a) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), (a))
#define VSQRT(a) _mm256_sqrt_ps(a)
#define VSIGNOF(x, m) _mm256_or_ps((m), _mm256_and_ps((x), _mm256_set1_ps(-0.0f)))
#define VSEL_LT(x, y, a, b) _mm256_blendv_ps((b), (a), _mm256_cmp_ps((x), (y), _CMP_LT_OQ))
/* a 12-bit estimate and one Newton step: within 2 ulp */
static inline __m256 VRCP(__m256 x) {
  const __m256 r = _mm256_rcp_ps(x);
  return _mm256_fmadd_ps(r, _mm256_fnmadd_ps(x, r, _mm256_set1_ps(1.0f)), r);
}
#define VSTREAM(p, v) _mm256_stream_ps((p), (v))
#define VSFENCE() _mm_sfence()
static inline void VSTORE_U8(void *p, __m256 v) {
  const __m256i i = _mm256_cvttps_epi32(v);
  const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  _mm_storel_epi64((__m128i *)p, _mm_packus_epi16(w, w));
}
#define VLOAD_U8(p) \
  _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p))))
static inline void VSTORE_BF16(void *p, __m256 v) {
  const __m256i b = _mm256_castps_si256(v), one = _mm256_set1_epi32(1);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), one);
  const __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
  _mm_storeu_si128((__m128i *)p,
                   _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}
#define VLOAD_BF16(p) _mm256_castsi256_ps(_mm256_slli_epi32( \
  _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))), 16))
#define VFLOOR(a) _mm256_floor_ps(a)
/* each half of the table in one register, the entry chosen by the index's 8s bit */
static inline __m256 VTABLE16(const float *t, __m256 f) {
  const __m256i i = _mm256_cvttps_epi32(f);
  const __m256 lo = _mm256_permutevar8x32_ps(_mm256_load_ps(t), i);
  const __m256 hi = _mm256_permutevar8x32_ps(_mm256_load_ps(t + 8), i);
  return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_cmpgt_epi32(i, _mm256_set1_epi32(7))));
}
static inline __m256 VLOADS2(const float *p) {
  /* a0 a2 b0 b2 | a4 a6 b4 b6, then the 64-bit pairs reordered to a0 a2 a4 a6 b0 b2 b4 b6 */
  __m256 t = _mm256_shuffle_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8), _MM_SHUFFLE(2, 0, 2, 0));
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), _MM_SHUFFLE(3, 1, 2, 0)));
}
"""

# VLOG's split of x into 2**k * (1 + f), 1 + f in [sqrt(1/2), sqrt(2)): adding
# 1.0f - sqrt(1/2) to the bits carries into the exponent exactly when the mantissa is at
# least sqrt(2), and the low 23 bits put back on sqrt(1/2)'s pattern give 1 + f.
_AVX512_LOG_SPLIT = """\
static inline __m512 tc_log_split(__m512 x, __m512 *k) {
  const __m512i i = _mm512_add_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(TC_LOG_SHIFT));
  *k = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(i, 23), _mm512_set1_epi32(127)));
  const __m512i m = _mm512_add_epi32(_mm512_and_si512(i, _mm512_set1_epi32(0x007fffff)),
                                     _mm512_set1_epi32(TC_LOG_SQRTH));
  return _mm512_sub_ps(_mm512_castsi512_ps(m), _mm512_set1_ps(1.0f));
}
"""

_AVX2_LOG_SPLIT = """\
static inline __m256 tc_log_split(__m256 x, __m256 *k) {
  const __m256i i = _mm256_add_epi32(_mm256_castps_si256(x), _mm256_set1_epi32(TC_LOG_SHIFT));
  *k = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(i, 23), _mm256_set1_epi32(127)));
  const __m256i m = _mm256_add_epi32(_mm256_and_si256(i, _mm256_set1_epi32(0x007fffff)),
                                     _mm256_set1_epi32(TC_LOG_SQRTH));
  return _mm256_sub_ps(_mm256_castsi256_ps(m), _mm256_set1_ps(1.0f));
}
"""

def _generic_flags() -> tuple[str, ...]:
    return ("-march=x86-64",) if platform.machine() in ("x86_64", "AMD64") else ()


# u8 x s8 dot products (IsaDialect.int8). With AVX512-VNNI one vpdpbusd takes four K
# elements per lane; without it, u8 and s8 widen to s16 pairs and vpmaddwd sums each pair
# into int32 exactly (vpmaddubsw would saturate at 255 x 127 x 2).
_AVX512_VNNI_INT8 = """\
#include <stdint.h>
#pragma GCC target("avx512vnni")
typedef __m512i ivec;
typedef __m512i ia_t;
typedef __m512i ibv_t;
typedef int8_t ib_t;
#define IB_FROM(x) ((ib_t)(x))
#define IGROUP 4
#define IZERO() _mm512_setzero_si512()
static inline __m512i IBCAST(const uint8_t *p) {
  int32_t x;
  __builtin_memcpy(&x, p, 4);
  return _mm512_set1_epi32(x);
}
#define ILOADB(pb) _mm512_loadu_si512((const void *)(pb))
#define IDOT(acc, a, b) _mm512_dpbusd_epi32((acc), (a), (b))
#define ISTOREU(p, v) _mm512_storeu_si512((void *)(p), (v))
"""


_BF16_TARGET = '#pragma GCC target("avx512bf16")\n'
"""What a kernel built on a CPU with AVX512-BF16 is compiled for, from its first line."""

# bf16 pairs with AVX512-BF16: vdpbf16ps adds both products of a lane's pair to its float.
_AVX512_BF16 = """\
#include <stdint.h>
#pragma GCC target("avx512bf16")
typedef __m512 ivec;
typedef __m512bh ia_t;
typedef __m512bh ibv_t;
typedef uint16_t ib_t;
#define IB_FROM(x) (x)
#define IGROUP 2
#define IZERO() _mm512_setzero_ps()
static inline __m512bh IBCAST(const uint16_t *p) {
  int32_t x;
  __builtin_memcpy(&x, p, 4);
  return (__m512bh)_mm512_set1_epi32(x);
}
#define ILOADB(pb) ((__m512bh)_mm512_loadu_si512((const void *)(pb)))
#define IDOT(acc, a, b) _mm512_dpbf16_ps((acc), (a), (b))
#define ISTOREU(p, v) _mm512_storeu_ps((p), (v))
"""


def _pairs_int8(bits: int) -> str:
    """The 16-bit multiply-add int8 vocabulary for ``bits``-wide integer vectors.

    IBCAST widens a pair of u8 to two s16 in every 32-bit lane with one broadcast load and
    one byte shuffle: building the word in scalar registers first took six instructions a
    broadcast, and left the 7-pixel AVX2 conv tile bound by the front end (58.7 GFLOP/s,
    against 83.6 for float32 on the Zen 3). It reads the two bytes after the pair: the packed
    activations keep slack past their end (the matmul's A four bytes, the conv's Xq
    pixels)."""
    p, si = (f"_mm{bits}" if bits == 256 else "_mm512"), f"si{bits}"
    pattern = ", ".join(["-128, 1, -128, 0"] * (bits // 32))  # high byte first
    return f"""\
#include <stdint.h>
typedef __m{bits}i ivec;
typedef __m{bits}i ia_t;
typedef __m{bits}i ibv_t;
typedef int16_t ib_t;
#define IB_FROM(x) ((ib_t)(x))
#define IGROUP 2
#define IZERO() {p}_setzero_{si}()
static inline __m{bits}i IBCAST(const uint8_t *p) {{
  int32_t x;
  __builtin_memcpy(&x, p, 4);
  return {p}_shuffle_epi8({p}_set1_epi32(x), {p}_set_epi8({pattern}));
}}
#define ILOADB(pb) {p}_loadu_{si}((const void *)(pb))
#define IDOT(acc, a, b) {p}_add_epi32((acc), {p}_madd_epi16((a), (b)))
#define ISTOREU(p, v) {p}_storeu_{si}((void *)(p), (v))
"""


DIALECTS: dict[str, IsaDialect] = {
    "avx512": IsaDialect(
        "avx512", 16,
        _AVX512_PRELUDE + _AVX512_MATH + _AVX512_MORE + TANH_ERF + SCALAR_EXP,
        ("-march=x86-64-v4", "-mtune=generic", "-mprefer-vector-width=512"),
        LOG_CONSTANTS + _AVX512_LOG_SPLIT + LOG, _pairs_int8(512), BF16_BY_FMA,
    ),
    "avx2": IsaDialect("avx2", 8,
                       _AVX2_PRELUDE + _AVX2_MATH + _AVX2_MORE + TANH_ERF + SCALAR_EXP,
                       ("-march=x86-64-v3", "-mtune=generic"),
                       LOG_CONSTANTS + _AVX2_LOG_SPLIT + LOG, _pairs_int8(256), BF16_BY_FMA),
    "generic": portable_dialect(_generic_flags()),
}


def kernel_flags(d: IsaDialect, threads: int) -> tuple[str, ...]:
    """What a kernel in dialect ``d`` is built with: the base flags, the dialect's, and
    OpenMP only where it runs threads (a one-thread kernel links nothing)."""
    return BASE_FLAGS + d.flags + (("-fopenmp",) if threads > 1 else ())


AMX_FEATURES = {"int8": frozenset({"amx_tile", "amx_int8"}),
                "bf16": frozenset({"amx_tile", "amx_bf16"})}
"""The CPU features a dtype's AMX tiles need (beside its AVX-512 dot product)."""


@functools.lru_cache(maxsize=64)
def dialect_for(isa: str, features: tuple[str, ...] = ()) -> IsaDialect:
    """The dialect of ``isa`` on a CPU with ``features``: AVX-512's int8 words use VNNI and
    its bf16 words AVX512-BF16 where the CPU has them."""
    base = dialect(isa)
    if isa != "avx512":
        return base
    if "avx512_vnni" in features:
        base = replace(base, int8=_AVX512_VNNI_INT8, native=base.native | {"int8"})
    if "avx512_bf16" in features:
        # before the prelude, so its VSTORE_BF16 sees __AVX512BF16__ (vcvtneps2bf16)
        base = replace(base, bf16=_AVX512_BF16, native=base.native | {"bf16"},
                       prelude=_BF16_TARGET + base.prelude)
    tiles = tuple((dtype, _amx(dtype)) for dtype, needs in AMX_FEATURES.items()
                  if dtype in base.native and needs <= set(features))
    return replace(base, tiles=tiles) if tiles else base


def _amx(dtype: str) -> str:
    """The AMX tile vocabulary of ``dtype`` (``IsaDialect.tiles``): ``tdpbusd`` (u8 x s8,
    int32) or ``tdpbf16ps`` (bf16 pairs, float32), every tile 16 rows x 64 bytes."""
    target, dot, tk = (("amx-int8", "_tile_dpbusd", 64) if dtype == "int8"
                       else ("amx-bf16", "_tile_dpbf16ps", 32))
    return f"""\
#include <string.h>
#pragma GCC target("amx-tile,{target}")
const int tc_needs_tiles = 1;
#define TK {tk}
typedef struct {{
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
}} tc_tile_config;
static inline void TCONFIG_K(int a, int b, int kb) {{
  tc_tile_config c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < 8; t++) {{
    c.colsb[t] = t >= a && t < b ? kb : 64;
    c.rows[t] = t >= b ? kb / 4 : 16;
  }}
  _tile_loadconfig(&c);
}}
#define TCONFIG() TCONFIG_K(8, 8, 64)
#define TZERO(t) _tile_zero(t)
#define TLOAD(t, p, stride) _tile_loadd(t, (const void *)(p), (stride))
#define TSTORE(t, p, stride) _tile_stored(t, (void *)(p), (stride))
#define TDOT(c, a, b) {dot}(c, a, b)
#define TRELEASE() _tile_release()
"""


def dialect(isa: str) -> IsaDialect:
    try:
        return DIALECTS[isa]
    except KeyError:
        raise ValueError(f"no code generator for ISA {isa!r}; have {', '.join(DIALECTS)}") from None


# The x86-64 levels: x86-64-v4's AVX-512 subsets, v3's AVX2 with FMA, and portable code; the
# low-precision extensions each may carry (VNNI dot products, BF16 and FP16 arithmetic, AMX
# tiles), by their /proc/cpuinfo names.
AVX512_FEATURES = frozenset({"avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
                             "amx_tile", "amx_int8", "amx_bf16"})
X86_LEVELS = (
    register_isa_level(IsaLevel("avx512", "x86_64", 512, 32,
                                frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"}), 2,
                                AVX512_FEATURES)),
    register_isa_level(IsaLevel("avx2", "x86_64", 256, 16, frozenset({"avx2", "fma"}), 1,
                                frozenset({"avx_vnni"}))),
    register_isa_level(IsaLevel(PORTABLE_ISA, "x86_64", 128, 16, frozenset(), 0)),
)
