"""Per-ISA vocabulary for generated C: vector type, intrinsics and compiler flags.

AVX-512 and AVX2 kernels use Intel intrinsics; the portable fallback uses GCC/Clang vector
extensions (16-byte vectors), which compile on any target those compilers support.

Every dialect's prelude defines the same vocabulary over the type ``vec``:

* loads and stores: ``VLOAD``/``VSTORE`` (aligned), ``VLOADU``/``VSTOREU`` (unaligned),
  ``VLOADU_PART(p, n)`` (the first ``n`` lanes from ``p``, the others 0, nothing read past
  ``p + n``), ``VSTOREU_PART(p, v, n)`` (the first ``n`` lanes only); ``0 <= n <= lanes``;
* arithmetic: ``VZERO``, ``VSET1``, ``VADD``, ``VSUB``, ``VMUL``, ``VDIV``, ``VFMA(a, b, c)``
  (``a*b + c``), ``VMAX``, ``VMIN`` (both return ``b`` when either is NaN, like x86
  ``maxps``), ``VRELU``;
* lanes: ``VFILL_PART(v, n, x)`` (lanes from ``n`` on set to the float ``x``),
  ``VHSUM(v)``, ``VHMAX(v)`` (horizontal sum / max, a float);
* ``VEXP(v)``: e**v per lane, within 2 ulp (about 1.5e-7 relative) for
  ``-87.33 <= v <= 88``; 0 below (-inf included), saturating at e**88 above; NaN stays NaN.
  Cody-Waite reduction by ln 2 and the Cephes ``expf`` polynomial, no scalar code;
  ``FEXP(x)`` is the same for one ``float`` in plain C (no libm: kernels link nothing), for
  scalar epilogue loops (``FTANH`` and ``FERF``, outside the prelude, in :data:`SCALAR_MATH`);
* more element-wise math: ``VNEG``, ``VABS``, ``VSQRT``, ``VSIGNOF(x, m)`` (``m >= 0`` with
  the sign of ``x``), ``VSEL_LT(x, y, a, b)`` (per lane ``x < y ? a : b``), ``VTANH(v)``
  (odd polynomial below ``|v| = 0.625``, ``1 - 2/(e**2|v| + 1)`` above; within 2e-7
  relative), ``VERF(v)`` (``v*P(v*v)`` below ``|v| = 1``, within 2e-7 relative;
  Abramowitz-Stegun 7.1.26 above, within 4e-7 absolute);
* strided and streaming memory: ``VLOADS2(p)`` (lanes ``p[0], p[2], ...``; reads
  ``2*lanes`` floats from ``p``), ``VSTREAM(p, v)`` (non-temporal store to an address
  aligned to the vector size; a plain store on ``generic``) and ``VSFENCE()`` (orders
  streaming stores; call it before a kernel returns).

Outside the prelude, in :attr:`IsaDialect.log` (a kernel that needs it places it after the
prelude): ``VLOG(v)``, ln v per lane for positive, normal, finite ``v`` (0, subnormals,
negatives, inf and NaN are outside its contract), within 1 ulp where ``|ln v| >= 1`` and
5e-8 absolute below; ``v = 2**k * m`` with ``m`` in ``[sqrt(1/2), sqrt(2))`` split by
integer arithmetic on the bits, the Cephes ``logf`` polynomial for ``ln m``.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

# Never -ffast-math: a shared object built with it switches FTZ/DAZ on for the whole process.
# ISO dialects (-std=c11) disable FMA contraction, so use the GNU dialect and ask for it.
# Loops start on a cache line: where GCC's default 16-byte alignment leaves a micro-kernel's
# loop straddling one more 64-byte line, the same kernel runs 5-8% slower on Zen 3 (ARCHITECTURE
# change 64), so without it a kernel's speed depends on the code placed before it.
BASE_FLAGS = ("-O3", "-std=gnu11", "-fPIC", "-shared", "-ffp-contract=fast", "-fno-math-errno",
              "-falign-loops=64")


@dataclass(frozen=True, slots=True)
class IsaDialect:
    """How to spell vector operations on one ISA level."""

    name: str
    lanes: int
    prelude: str
    flags: tuple[str, ...]
    log: str = ""
    """C defining ``VLOG`` (module docstring), for the few kernels that need it: kept out of
    the prelude, which every kernel's source and so its build-cache key holds."""


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
#define VRELU(a) _mm512_max_ps((a), _mm512_setzero_ps())
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
#define VRELU(a) _mm256_max_ps((a), _mm256_setzero_ps())
"""

_GENERIC_PRELUDE = """\
typedef float vec __attribute__((vector_size(16)));
typedef float vec_u __attribute__((vector_size(16), aligned(4)));
typedef int vec_i __attribute__((vector_size(16)));
#define VZERO() ((vec){0.0f, 0.0f, 0.0f, 0.0f})
#define VLOAD(p) (*(const vec *)(p))
#define VLOADU(p) (*(const vec_u *)(p))
#define VSTORE(p, v) (*(vec *)(p) = (v))
#define VSTOREU(p, v) (*(vec_u *)(p) = (v))
#define VSET1(x) ((vec){0.0f, 0.0f, 0.0f, 0.0f} + (x))
#define VFMA(a, b, c) ((a) * (b) + (c))
#define VADD(a, b) ((a) + (b))
static inline vec VRELU(vec a) { return (vec)((vec_i)a & (a > VZERO())); }
"""


# Shared by every dialect's VEXP: the range where e**x is a normal float32, the Cody-Waite
# split of ln 2 (its high part has few bits, so n*ln2_hi is exact) and the Cephes expf
# minimax polynomial for e**r on [-ln2/2, ln2/2].
_EXP_CONSTANTS = """\
#define TC_EXP_LO (-87.33654475f)
#define TC_EXP_HI 88.0f
#define TC_LOG2E 1.44269504088896341f
#define TC_LN2_HI 0.693359375f
#define TC_LN2_LO (-2.12194440e-4f)
#define TC_EXP_P0 1.9875691500e-4f
#define TC_EXP_P1 1.3981999507e-3f
#define TC_EXP_P2 8.3334519073e-3f
#define TC_EXP_P3 4.1665795894e-2f
#define TC_EXP_P4 1.6666665459e-1f
#define TC_EXP_P5 5.0000001201e-1f
"""

_AVX512_MATH = _EXP_CONSTANTS + """\
#define VMAX(a, b) _mm512_max_ps((a), (b))
#define VMIN(a, b) _mm512_min_ps((a), (b))
#define VMUL(a, b) _mm512_mul_ps((a), (b))
#define VSUB(a, b) _mm512_sub_ps((a), (b))
#define VDIV(a, b) _mm512_div_ps((a), (b))
#define VHSUM(v) _mm512_reduce_add_ps(v)
#define VHMAX(v) _mm512_reduce_max_ps(v)
#define VLOADU_PART(p, n) _mm512_maskz_loadu_ps(tc_part_mask(n), (p))
#define VSTOREU_PART(p, v, n) _mm512_mask_storeu_ps((p), tc_part_mask(n), (v))
#define VFILL_PART(v, n, x) _mm512_mask_blend_ps(tc_part_mask(n), _mm512_set1_ps(x), (v))
#define VEXP(x) tc_exp(x)
static inline __mmask16 tc_part_mask(int n) { return (__mmask16)((1u << n) - 1u); }
static inline __m512 tc_exp(__m512 x) {
  const __m512 lo = _mm512_set1_ps(TC_EXP_LO);
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
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
  return _mm512_maskz_mul_ps((__mmask16)~under, p, _mm512_castsi512_ps(e));
}
"""

_AVX2_MATH = _EXP_CONSTANTS + """\
#define VMAX(a, b) _mm256_max_ps((a), (b))
#define VMIN(a, b) _mm256_min_ps((a), (b))
#define VMUL(a, b) _mm256_mul_ps((a), (b))
#define VSUB(a, b) _mm256_sub_ps((a), (b))
#define VDIV(a, b) _mm256_div_ps((a), (b))
#define VHSUM(v) tc_hsum(v)
#define VHMAX(v) tc_hmax(v)
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
static inline __m256 tc_exp(__m256 x) {
  const __m256 lo = _mm256_set1_ps(TC_EXP_LO);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
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
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
"""

# Plain C (no intrinsics): GCC vector extensions; comparisons give all-ones int lanes.
_GENERIC_MATH = _EXP_CONSTANTS + """\
#define VMAX(a, b) tc_vmax((a), (b))
#define VMIN(a, b) tc_vmin((a), (b))
#define VMUL(a, b) ((a) * (b))
#define VSUB(a, b) ((a) - (b))
#define VDIV(a, b) ((a) / (b))
#define VHSUM(v) tc_hsum(v)
#define VHMAX(v) tc_hmax(v)
#define VLOADU_PART(p, n) tc_loadu_part((p), (n))
#define VSTOREU_PART(p, v, n) tc_storeu_part((p), (v), (n))
#define VFILL_PART(v, n, x) tc_select(tc_part_mask(n), (v), VSET1(x))
#define VEXP(x) tc_exp(x)
static inline vec tc_select(vec_i m, vec a, vec b) {
  return (vec)((m & (vec_i)a) | (~m & (vec_i)b));
}
static inline vec tc_vmax(vec a, vec b) { return tc_select(a > b, a, b); }
static inline vec tc_vmin(vec a, vec b) { return tc_select(a < b, a, b); }
static inline vec_i tc_part_mask(int n) { return (vec_i){0, 1, 2, 3} < n; }
static inline float tc_hsum(vec v) { return (v[0] + v[2]) + (v[1] + v[3]); }
static inline float tc_hmax(vec v) {
  float a = v[0] > v[2] ? v[0] : v[2], b = v[1] > v[3] ? v[1] : v[3];
  return a > b ? a : b;
}
static inline vec tc_loadu_part(const float *p, int n) {
  vec v = VZERO();
  for (int i = 0; i < n; i++) v[i] = p[i];
  return v;
}
static inline void tc_storeu_part(float *p, vec v, int n) {
  for (int i = 0; i < n; i++) p[i] = v[i];
}
static inline vec tc_exp(vec x) {
  const vec lo = VSET1(TC_EXP_LO), hi = VSET1(TC_EXP_HI);
  const vec_i under = x < lo;
  x = tc_select(under, lo, x);
  x = tc_select(x > hi, hi, x);
  /* round to nearest: adding 1.5 * 2**23 leaves no fraction bits (|t| < 2**22) */
  const vec magic = VSET1(12582912.0f);
  const vec n = (x * VSET1(TC_LOG2E) + magic) - magic;
  vec r = x - n * VSET1(TC_LN2_HI);
  r = r - n * VSET1(TC_LN2_LO);
  vec p = VSET1(TC_EXP_P0) * r + VSET1(TC_EXP_P1);
  p = p * r + VSET1(TC_EXP_P2);
  p = p * r + VSET1(TC_EXP_P3);
  p = p * r + VSET1(TC_EXP_P4);
  p = p * r + VSET1(TC_EXP_P5);
  p = p * (r * r) + (r + VSET1(1.0f));
  const vec_i e = (__builtin_convertvector(n, vec_i) + 127) << 23;
  return tc_select(under, VZERO(), p * (vec)e);
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
#define VSTREAM(p, v) _mm512_stream_ps((p), (v))
#define VSFENCE() _mm_sfence()
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
#define VSTREAM(p, v) _mm256_stream_ps((p), (v))
#define VSFENCE() _mm_sfence()
static inline __m256 VLOADS2(const float *p) {
  /* a0 a2 b0 b2 | a4 a6 b4 b6, then the 64-bit pairs reordered to a0 a2 a4 a6 b0 b2 b4 b6 */
  __m256 t = _mm256_shuffle_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8), _MM_SHUFFLE(2, 0, 2, 0));
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), _MM_SHUFFLE(3, 1, 2, 0)));
}
"""

_GENERIC_MORE = """\
#define VNEG(a) (-(a))
#define VSTREAM(p, v) VSTORE((p), (v))
#define VSFENCE() ((void)0)
#define TC_SIGN_BITS ((vec_i){-2147483647 - 1, -2147483647 - 1, -2147483647 - 1, -2147483647 - 1})
static inline vec VABS(vec a) { return (vec)((vec_i)a & ~TC_SIGN_BITS); }
static inline vec VSIGNOF(vec x, vec m) { return (vec)((vec_i)m | ((vec_i)x & TC_SIGN_BITS)); }
static inline vec VSEL_LT(vec x, vec y, vec a, vec b) { return tc_select(x < y, a, b); }
static inline vec VSQRT(vec a) {
  vec r;
  for (int i = 0; i < 4; i++) r[i] = __builtin_sqrtf(a[i]);
  return r;
}
static inline vec VLOADS2(const float *p) { return (vec){p[0], p[2], p[4], p[6]}; }
"""

# tanh and erf from the vocabulary above, the same on every ISA (coefficients: Cephes tanhf
# and erff, and Abramowitz-Stegun 7.1.26 for |x| >= 1).
_TANH_ERF = """\
static inline vec VTANH(vec x) {
  vec a = VABS(x), z = VMUL(x, x);
  vec p = VFMA(VSET1(-5.70498872745e-3f), z, VSET1(2.06390887954e-2f));
  p = VFMA(p, z, VSET1(-5.37397155531e-2f));
  p = VFMA(p, z, VSET1(1.33314422036e-1f));
  p = VFMA(p, z, VSET1(-3.33332819422e-1f));
  vec small = VFMA(VMUL(p, z), x, x);
  vec big = VSUB(VSET1(1.0f), VDIV(VSET1(2.0f), VADD(VEXP(VADD(a, a)), VSET1(1.0f))));
  return VSEL_LT(a, VSET1(0.625f), small, VSIGNOF(x, big));
}
static inline vec VERF(vec x) {
  vec a = VMIN(VABS(x), VSET1(6.0f)), z = VMUL(x, x);
  vec p = VFMA(VSET1(7.853861353153693e-5f), z, VSET1(-8.010193625184903e-4f));
  p = VFMA(p, z, VSET1(5.188327685732524e-3f));
  p = VFMA(p, z, VSET1(-2.685381193529856e-2f));
  p = VFMA(p, z, VSET1(1.128358514861418e-1f));
  p = VFMA(p, z, VSET1(-3.761262582423300e-1f));
  p = VFMA(p, z, VSET1(1.128379165726710f));
  vec small = VMUL(p, x);
  vec t = VDIV(VSET1(1.0f), VFMA(a, VSET1(0.3275911f), VSET1(1.0f)));
  vec s = VFMA(VSET1(1.061405429f), t, VSET1(-1.453152027f));
  s = VFMA(s, t, VSET1(1.421413741f));
  s = VFMA(s, t, VSET1(-0.284496736f));
  s = VFMA(s, t, VSET1(0.254829592f));
  vec big = VSUB(VSET1(1.0f), VMUL(VMUL(s, t), VEXP(VNEG(VMUL(a, a)))));
  return VSEL_LT(a, VSET1(1.0f), small, VSIGNOF(x, big));
}
"""

# VEXP for one float, in plain C on every ISA: the clamp maps NaN to the low bound (so the
# exponent conversion stays defined) and the result puts it back.
_SCALAR_EXP = """\
static inline float FEXP(float x) {
  const float c = x > TC_EXP_LO ? (x < TC_EXP_HI ? x : TC_EXP_HI) : TC_EXP_LO;
  const float n = (c * TC_LOG2E + 12582912.0f) - 12582912.0f;
  float r = c - n * TC_LN2_HI;
  r = r - n * TC_LN2_LO;
  float p = TC_EXP_P0 * r + TC_EXP_P1;
  p = p * r + TC_EXP_P2;
  p = p * r + TC_EXP_P3;
  p = p * r + TC_EXP_P4;
  p = p * r + TC_EXP_P5;
  p = p * (r * r) + (r + 1.0f);
  union { int i; float f; } e;
  e.i = ((int)n + 127) << 23;
  if (x < TC_EXP_LO) return 0.0f;
  return x == x ? p * e.f : x;
}
"""


# VTANH and VERF for one float, the same polynomials, for scalar epilogue loops: plain C on
# every ISA (FEXP is the prelude's). Outside the prelude, so that only kernels whose epilogue
# needs them hold them (epilogue.scalar_helpers) and no other kernel's source changes.
SCALAR_MATH = {
    "FTANH": """\
static inline float FTANH(float x) {
  const float a = x < 0.0f ? -x : x, z = x * x;
  if (a < 0.625f) {
    float p = -5.70498872745e-3f * z + 2.06390887954e-2f;
    p = p * z + -5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z + -3.33332819422e-1f;
    return p * z * x + x;
  }
  const float big = 1.0f - 2.0f / (FEXP(a + a) + 1.0f);
  return x < 0.0f ? -big : big;
}
""",
    "FERF": """\
static inline float FERF(float x) {
  const float a = x < 0.0f ? (-x < 6.0f ? -x : 6.0f) : (x < 6.0f ? x : 6.0f), z = x * x;
  if (a < 1.0f) {
    float p = 7.853861353153693e-5f * z + -8.010193625184903e-4f;
    p = p * z + 5.188327685732524e-3f;
    p = p * z + -2.685381193529856e-2f;
    p = p * z + 1.128358514861418e-1f;
    p = p * z + -3.761262582423300e-1f;
    p = p * z + 1.128379165726710f;
    return p * x;
  }
  const float t = 1.0f / (a * 0.3275911f + 1.0f);
  float s = 1.061405429f * t + -1.453152027f;
  s = s * t + 1.421413741f;
  s = s * t + -0.284496736f;
  s = s * t + 0.254829592f;
  const float big = 1.0f - s * t * FEXP(-(a * a));
  return x < 0.0f ? -big : big;
}
""",
}
"""C of each scalar helper, by name."""


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

_GENERIC_LOG_SPLIT = """\
static inline vec tc_log_split(vec x, vec *k) {
  const vec_i i = (vec_i)x + TC_LOG_SHIFT;
  *k = __builtin_convertvector((i >> 23) - 127, vec);
  return (vec)((i & 0x007fffff) + TC_LOG_SQRTH) - VSET1(1.0f);
}
"""

# ln(1 + f) = f - f*f/2 + f**3 * P(f) with the Cephes logf coefficients, plus k*ln 2 in
# VEXP's two parts (the high one has few bits, so k*ln2_hi is exact).
_LOG = """\
static inline vec VLOG(vec x) {
  vec k;
  const vec f = tc_log_split(x, &k), z = VMUL(f, f);
  vec p = VFMA(VSET1(7.0376836292e-2f), f, VSET1(-1.1514610310e-1f));
  p = VFMA(p, f, VSET1(1.1676998740e-1f));
  p = VFMA(p, f, VSET1(-1.2420140846e-1f));
  p = VFMA(p, f, VSET1(1.4249322787e-1f));
  p = VFMA(p, f, VSET1(-1.6668057665e-1f));
  p = VFMA(p, f, VSET1(2.0000714765e-1f));
  p = VFMA(p, f, VSET1(-2.4999993993e-1f));
  p = VFMA(p, f, VSET1(3.3333331174e-1f));
  vec y = VFMA(k, VSET1(TC_LN2_LO), VMUL(VMUL(p, f), z));
  y = VFMA(VSET1(-0.5f), z, y);
  return VFMA(k, VSET1(TC_LN2_HI), VADD(f, y));
}
"""
_LOG_CONSTANTS = """\
#define TC_LOG_SQRTH 0x3f3504f3
#define TC_LOG_SHIFT (0x3f800000 - TC_LOG_SQRTH)
"""


def _generic_flags() -> tuple[str, ...]:
    return ("-march=x86-64",) if platform.machine() in ("x86_64", "AMD64") else ()


DIALECTS: dict[str, IsaDialect] = {
    "avx512": IsaDialect(
        "avx512", 16,
        _AVX512_PRELUDE + _AVX512_MATH + _AVX512_MORE + _TANH_ERF + _SCALAR_EXP,
        ("-march=x86-64-v4", "-mtune=generic", "-mprefer-vector-width=512"),
        _LOG_CONSTANTS + _AVX512_LOG_SPLIT + _LOG,
    ),
    "avx2": IsaDialect("avx2", 8,
                       _AVX2_PRELUDE + _AVX2_MATH + _AVX2_MORE + _TANH_ERF + _SCALAR_EXP,
                       ("-march=x86-64-v3", "-mtune=generic"),
                       _LOG_CONSTANTS + _AVX2_LOG_SPLIT + _LOG),
    "generic": IsaDialect("generic", 4,
                          _GENERIC_PRELUDE + _GENERIC_MATH + _GENERIC_MORE + _TANH_ERF
                          + _SCALAR_EXP,
                          _generic_flags(), _LOG_CONSTANTS + _GENERIC_LOG_SPLIT + _LOG),
}


def dialect(isa: str) -> IsaDialect:
    try:
        return DIALECTS[isa]
    except KeyError:
        raise ValueError(f"no code generator for ISA {isa!r}; have {', '.join(DIALECTS)}") from None
