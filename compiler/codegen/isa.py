"""The vocabulary kind emitters write generated C in, and its portable spelling.

A backend defines one :class:`IsaDialect` per ISA level it generates code for (the x86 ones
are in :mod:`tunecache.compiler.backends.cpu.isa`); this module holds the contract, the
C shared by every dialect (the exp/log/tanh/erf polynomials), and :func:`portable_dialect`,
spelled with GCC/Clang vector extensions (16-byte vectors), which compile on any target those
compilers support.

Every dialect's prelude defines the same vocabulary over the type ``vec``:

* loads and stores: ``VLOAD``/``VSTORE`` (aligned), ``VLOADU``/``VSTOREU`` (unaligned),
  ``VLOADU_PART(p, n)`` (the first ``n`` lanes from ``p``, the others 0, nothing read past
  ``p + n``), ``VSTOREU_PART(p, v, n)`` (the first ``n`` lanes only); ``0 <= n <= lanes``;
* arithmetic: ``VZERO``, ``VSET1``, ``VADD``, ``VSUB``, ``VMUL``, ``VDIV``, ``VFMA(a, b, c)``
  (``a*b + c``), ``VMAX``, ``VMIN`` (both return ``b`` when either is NaN, like x86
  ``maxps``), ``VMAXN``, ``VMINN`` (NaN when either is NaN: a reduction or a binary Max of
  two tensors never hides one), ``VRELU`` (``VMAX(VZERO(), a)``: NaN stays NaN, as
  onnxruntime's Relu keeps it);
* lanes: ``VFILL_PART(v, n, x)`` (lanes from ``n`` on set to the float ``x``),
  ``VHSUM(v)``, ``VHMAX(v)`` (horizontal sum / max, a float), ``VHMAXN(v)`` (max, NaN if
  any lane is);
* ``VEXP(v)``: e**v per lane, within 2 ulp (about 1.5e-7 relative) for
  ``-87.33 <= v <= 88``; 0 below (-inf included), saturating at e**88 up to ln of the
  largest float (88.72) and inf above (+inf included); NaN stays NaN.
  Cody-Waite reduction by ln 2 and the Cephes ``expf`` polynomial, no scalar code;
  ``FEXP(x)`` is the same for one ``float`` in plain C (no libm: kernels link nothing), for
  scalar epilogue loops (``FTANH`` and ``FERF``, outside the prelude, in :data:`SCALAR_MATH`);
* more element-wise math: ``VNEG``, ``VABS``, ``VSQRT``, ``VSIGNOF(x, m)`` (``m >= 0`` with
  the sign of ``x``), ``VSEL_LT(x, y, a, b)`` (per lane ``x < y ? a : b``), ``VRCP(v)``
  (``1/v`` within 2 ulp for normal ``v``: an estimate refined by a Newton step where the ISA
  has one, a division elsewhere; NaN stays NaN), ``VTANH(v)``
  (odd polynomial below ``|v| = 0.625``, ``1 - 2/(e**2|v| + 1)`` above; within 2e-7
  relative), ``VERF(v)`` (``v*P(v*v)`` below ``|v| = 1``, within 2e-7 relative;
  Abramowitz-Stegun 7.1.26 above, within 4e-7 absolute), ``VGELU_ERF(v)`` (GELU, erf by
  a quartic per quarter of ``|v| / sqrt 2``, within 2e-7 ``|v|`` absolute);
  ``VFLOOR(v)`` (floor per lane for ``|v| < 2**22``), ``VTABLE16(t, f)`` (per lane
  ``t[f]``, ``t`` 16 floats aligned to 64 bytes, ``f`` a whole number in 0..15; any other
  lane, NaN included, reads some entry of ``t``);
* strided and streaming memory: ``VLOADS2(p)`` (lanes ``p[0], p[2], ...``; reads
  ``2*lanes`` floats from ``p``), ``VSTREAM(p, v)`` (non-temporal store to an address
  aligned to the vector size; a plain store on ``generic``) and ``VSFENCE()`` (orders
  streaming stores; call it before a kernel returns); ``VSTORE_U8(p, v)`` (the lanes, whole
  numbers in 0..255, as ``lanes`` bytes at ``p``) and ``VLOAD_U8(p)`` (``lanes`` bytes at
  ``p`` as floats); ``VSTORE_BF16(p, v)`` (the lanes rounded to bfloat16, nearest with ties
  to even, as ``lanes`` bit patterns at ``p``) and ``VLOAD_BF16(p)`` (``lanes`` bfloat16 at
  ``p`` as floats).

Outside the prelude, in :attr:`IsaDialect.log` (a kernel that needs it places it after the
prelude): ``VLOG(v)``, ln v per lane for positive, normal, finite ``v`` (0, subnormals,
negatives, inf and NaN are outside its contract), within 1 ulp where ``|ln v| >= 1`` and
5e-8 absolute below; ``v = 2**k * m`` with ``m`` in ``[sqrt(1/2), sqrt(2))`` split by
integer arithmetic on the bits, the Cephes ``logf`` polynomial for ``ln m``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BF16_SCALAR = """\
#include <stdint.h>
#include <string.h>
/* one float as bfloat16, nearest with ties to even; one bfloat16's value */
static inline uint16_t tc_bf16_round(float v) {
  uint32_t b;
  memcpy(&b, &v, sizeof b);
  return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}
static inline float tc_bf16_value(uint16_t h) {
  const uint32_t b = (uint32_t)h << 16;
  float v;
  memcpy(&v, &b, sizeof v);
  return v;
}
"""
"""C of the scalar bfloat16 conversions a kernel holding bfloat16 values uses."""


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
    int8: str = ""
    """C of the u8 x s8 dot-product vocabulary int8 kernels write in (empty: none), after
    the prelude: accumulators ``ivec`` (``lanes`` int32 lanes); ``IGROUP`` K elements one
    step consumes per lane; ``ib_t``, the type B is packed as (``IGROUP`` consecutive K
    elements per lane, lanes side by side), ``IB_FROM(x)`` one B element as ``ib_t``;
    ``IZERO()``; ``IBCAST(p)``, the ``IGROUP`` A elements at ``p`` in every lane (an
    ``ia_t``); ``ILOADB(pb)``, a vector of packed B (an ``ibv_t``); ``IDOT(acc, a, b)``,
    ``acc`` plus per lane the group's products, exact in int32; ``ISTOREU(p, v)``."""
    bf16: str = ""
    """The same vocabulary for bf16 (A and B as bfloat16 bit patterns, ``uint16_t``), over
    float32 accumulators, exact products summed in float32."""
    native: frozenset[str] = frozenset()
    """The low-precision dtypes whose vocabulary is the hardware's own dot product (VNNI,
    AVX512-BF16), not a widening emulation: what a precision policy may choose for speed."""
    tiles: tuple[tuple[str, str], ...] = ()
    """Per low-precision dtype with matrix tiles (AMX), the C of their vocabulary, after the
    dtype's dot-product vocabulary (whose ``IGROUP``, ``ib_t`` and ``IB_FROM`` it keeps):
    ``TK``, the K elements one tile row holds (64 bytes); ``TCONFIG()``, every tile 16 rows
    of 64 bytes, per thread before its first tile instruction; ``TCONFIG_K(a, b, kb)``, the
    same but tiles ``a .. b - 1`` (A) ``kb`` bytes a row and tiles from ``b`` (B) ``kb / 4``
    rows: a K step of ``kb`` bytes, not 64; ``TZERO(t)``,
    ``TLOAD(t, p, stride)``, ``TSTORE(t, p, stride)`` (stride in bytes), ``TDOT(c, a, b)``
    (tile ``c`` plus ``a`` (16 rows x ``TK``) times ``b`` (``TK / IGROUP`` rows of 16
    columns x ``IGROUP``), exact in int32 or summed in float32), ``TRELEASE()``. Its source
    defines the symbol ``tc_needs_tiles``, by which the loader knows to ask the OS for the
    tile state first."""

    def tile_vocabulary(self, dtype: str) -> str:
        """The tile vocabulary of ``dtype`` (empty: no tiles for it)."""
        return dict(self.tiles).get(dtype, "")


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
static inline vec VRELU(vec a) { return (vec)(~(VZERO() > a) & (vec_i)a); }
"""


# Shared by every dialect's VEXP: the range where e**x is a normal float32, the Cody-Waite
# split of ln 2 (its high part has few bits, so n*ln2_hi is exact) and the Cephes expf
# minimax polynomial for e**r on [-ln2/2, ln2/2].
EXP_CONSTANTS = """\
#define TC_EXP_LO (-87.33654475f)
#define TC_EXP_HI 88.0f
#define TC_EXP_OVER 88.72283935546875f  /* ln of the largest float: e**x is inf above */
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

# Plain C (no intrinsics): GCC vector extensions; comparisons give all-ones int lanes.
_GENERIC_MATH = EXP_CONSTANTS + """\
#define VMAX(a, b) tc_vmax((a), (b))
#define VMIN(a, b) tc_vmin((a), (b))
#define VMUL(a, b) ((a) * (b))
#define VSUB(a, b) ((a) - (b))
#define VDIV(a, b) ((a) / (b))
#define VHSUM(v) tc_hsum(v)
#define VHMAX(v) tc_hmax(v)
#define VMAXN(a, b) tc_vmaxn((a), (b))
#define VMINN(a, b) tc_vminn((a), (b))
#define VHMAXN(v) tc_hmaxn(v)
#define VLOADU_PART(p, n) tc_loadu_part((p), (n))
#define VSTOREU_PART(p, v, n) tc_storeu_part((p), (v), (n))
#define VFILL_PART(v, n, x) tc_select(tc_part_mask(n), (v), VSET1(x))
#define VEXP(x) tc_exp(x)
static inline vec tc_select(vec_i m, vec a, vec b) {
  return (vec)((m & (vec_i)a) | (~m & (vec_i)b));
}
static inline vec tc_vmax(vec a, vec b) { return tc_select(a > b, a, b); }
static inline vec tc_vmin(vec a, vec b) { return tc_select(a < b, a, b); }
static inline vec tc_vmaxn(vec a, vec b) { return tc_select((a > b) | (a != a), a, b); }
static inline vec tc_vminn(vec a, vec b) { return tc_select((a < b) | (a != a), a, b); }
static inline vec_i tc_part_mask(int n) { return (vec_i){0, 1, 2, 3} < n; }
static inline float tc_hsum(vec v) { return (v[0] + v[2]) + (v[1] + v[3]); }
static inline float tc_hmax(vec v) {
  float a = v[0] > v[2] ? v[0] : v[2], b = v[1] > v[3] ? v[1] : v[3];
  return a > b ? a : b;
}
static inline float tc_hmaxn(vec v) {
  float m = v[0];
  for (int i = 1; i < 4; i++) m = (m > v[i] || m != m) ? m : v[i];
  return m;
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
  const vec_i under = x < lo, over = x > VSET1(TC_EXP_OVER);
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
  return tc_select(over, VSET1(__builtin_inff()), tc_select(under, VZERO(), p * (vec)e));
}
"""


_GENERIC_MORE = """\
#define VNEG(a) (-(a))
#define VSTREAM(p, v) VSTORE((p), (v))
#define VSFENCE() ((void)0)
static inline void VSTORE_U8(void *p, vec v) {
  for (int i = 0; i < 4; i++) ((unsigned char *)p)[i] = (unsigned char)(int)v[i];
}
static inline vec VLOAD_U8(const void *p) {
  const unsigned char *b = (const unsigned char *)p;
  return (vec){(float)b[0], (float)b[1], (float)b[2], (float)b[3]};
}
static inline void VSTORE_BF16(void *p, vec v) {
  for (int i = 0; i < 4; i++) {
    union { float f; unsigned int u; } c = {v[i]};
    ((unsigned short *)p)[i] = (unsigned short)((c.u + 0x7FFFu + ((c.u >> 16) & 1u)) >> 16);
  }
}
static inline vec VLOAD_BF16(const void *p) {
  vec v;
  for (int i = 0; i < 4; i++) {
    union { unsigned int u; float f; } c = {(unsigned int)((const unsigned short *)p)[i] << 16};
    v[i] = c.f;
  }
  return v;
}
#define TC_SIGN_BITS ((vec_i){-2147483647 - 1, -2147483647 - 1, -2147483647 - 1, -2147483647 - 1})
static inline vec VABS(vec a) { return (vec)((vec_i)a & ~TC_SIGN_BITS); }
static inline vec VSIGNOF(vec x, vec m) { return (vec)((vec_i)m | ((vec_i)x & TC_SIGN_BITS)); }
static inline vec VSEL_LT(vec x, vec y, vec a, vec b) { return tc_select(x < y, a, b); }
#define VRCP(x) VDIV(VSET1(1.0f), (x))
static inline vec VSQRT(vec a) {
  vec r;
  for (int i = 0; i < 4; i++) r[i] = __builtin_sqrtf(a[i]);
  return r;
}
static inline vec VLOADS2(const float *p) { return (vec){p[0], p[2], p[4], p[6]}; }
static inline vec VFLOOR(vec a) {
  const vec r = (a + 12582912.0f) - 12582912.0f;  /* nearest, then down where it rose */
  return r - (vec)((vec_i)(r > a) & (vec_i)VSET1(1.0f));
}
static inline vec VTABLE16(const float *t, vec f) {
  vec r;
  for (int i = 0; i < 4; i++) r[i] = t[f[i] >= 0.0f && f[i] < 16.0f ? (int)f[i] : 0];
  return r;
}
"""

# tanh and erf from the vocabulary above, the same on every ISA (coefficients: Cephes tanhf
# and erff, and Abramowitz-Stegun 7.1.26 for |x| >= 1).
TANH_ERF = """\
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
  vec a = VMIN(VSET1(6.0f), VABS(x)), z = VMUL(x, x);  /* NaN stays NaN (VMIN's b) */
  vec p = VFMA(VSET1(7.853861353153693e-5f), z, VSET1(-8.010193625184903e-4f));
  p = VFMA(p, z, VSET1(5.188327685732524e-3f));
  p = VFMA(p, z, VSET1(-2.685381193529856e-2f));
  p = VFMA(p, z, VSET1(1.128358514861418e-1f));
  p = VFMA(p, z, VSET1(-3.761262582423300e-1f));
  p = VFMA(p, z, VSET1(1.128379165726710f));
  vec small = VMUL(p, x);
  vec t = VRCP(VFMA(a, VSET1(0.3275911f), VSET1(1.0f)));
  vec s = VFMA(VSET1(1.061405429f), t, VSET1(-1.453152027f));
  s = VFMA(s, t, VSET1(1.421413741f));
  s = VFMA(s, t, VSET1(-0.284496736f));
  s = VFMA(s, t, VSET1(0.254829592f));
  vec big = VSUB(VSET1(1.0f), VMUL(VMUL(s, t), VEXP(VNEG(VMUL(a, a)))));
  return VSEL_LT(a, VSET1(1.0f), small, VSIGNOF(x, big));
}
static inline vec VGELU_ERF(vec x) {
  /* 0.5 (x + |x| erf(|x| / sqrt 2)); erf of a = |x| / sqrt 2 by quarters of a, each a
     quartic in s = 4a - q (TC_ERFQ, q = floor(4a)); 1 from 15/4 (erf is within 1.2e-7). */
  const vec a = VMUL(VABS(x), VSET1(0.70710678118654752f));
  const vec t = VMIN(VSET1(15.5f), VMUL(a, VSET1(4.0f)));  /* NaN stays NaN */
  const vec q = VFLOOR(t), s = VSUB(t, q);
  vec e = VFMA(VTABLE16(TC_ERFQ4, q), s, VTABLE16(TC_ERFQ3, q));
  e = VFMA(e, s, VTABLE16(TC_ERFQ2, q));
  e = VFMA(e, s, VTABLE16(TC_ERFQ1, q));
  e = VFMA(e, s, VTABLE16(TC_ERFQ0, q));
  return VMUL(VSET1(0.5f), VFMA(VABS(x), e, x));
}
"""


def _erf_quarters(degree: int = 4) -> str:
    """C tables ``TC_ERFQ0 ..``: per quarter ``q`` of ``a`` in ``[0, 15/4)``, the
    coefficients (constant term first) of the polynomial in ``s = 4a - q`` (in ``[0, 1)``)
    that interpolates erf(a) at the Chebyshev nodes; quarter 15 is the constant 1. Within
    2.4e-7 of erf in float32, so GELU within 1.5e-7 ``|x|``: VGELU_ERF's table lookups
    and FMAs take half the instructions of 7.1.26's division and exponential."""
    k = np.arange(degree + 1)
    nodes = (np.cos((2 * k + 1) * np.pi / (2 * degree + 2)) + 1.0) / 2.0
    vander = np.vander(nodes, degree + 1, increasing=True)
    table = np.zeros((16, degree + 1))
    for q in range(15):
        table[q] = np.linalg.solve(vander, [math.erf((q + s) / 4.0) for s in nodes])
    table[15, 0] = 1.0
    return "".join(
        f"static const float TC_ERFQ{j}[16] __attribute__((aligned(64), unused)) = {{"
        + ", ".join(f"{v:.9e}f" for v in table[:, j].astype(np.float32)) + "};\n"
        for j in range(degree + 1))


TANH_ERF = _erf_quarters() + TANH_ERF
# VEXP for one float, in plain C on every ISA: the clamp maps NaN to the low bound (so the
# exponent conversion stays defined) and the result puts it back.
SCALAR_EXP = """\
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
  if (x > TC_EXP_OVER) return __builtin_inff();
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

# Mish, x * tanh(softplus(x)) = x * n / (n + 2) with n = e**x (e**x + 2): no log, and no
# cancellation for negative x (n ~ 2 e**x there); e**x capped at e**20, where the ratio is
# 1 in float32, so large x gives x rather than inf/inf. A NaN stays NaN.
SCALAR_MATH["FMISH"] = """\
static inline float FMISH(float x) {
  const float e = FEXP(x < 20.0f ? x : 20.0f), n = e * (e + 2.0f);
  return x * (n / (n + 2.0f));
}
"""
# The same for a vector (after the prelude, like the scalar helpers).
SCALAR_MATH["VMISH"] = """\
static inline vec VMISH(vec x) {
  const vec e = VEXP(VMIN(VSET1(20.0f), x)), n = VMUL(e, VADD(e, VSET1(2.0f)));
  return VMUL(x, VDIV(n, VADD(n, VSET1(2.0f))));
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
LOG = """\
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
LOG_CONSTANTS = """\
#define TC_LOG_SQRTH 0x3f3504f3
#define TC_LOG_SHIFT (0x3f800000 - TC_LOG_SQRTH)
"""


PORTABLE_INT8 = """\
#include <stdint.h>
typedef int32_t ivec __attribute__((vector_size(16)));
typedef int32_t ivec_u __attribute__((vector_size(16), aligned(4)));
typedef int32_t ib_t;
typedef ivec ia_t;
typedef ivec ibv_t;
#define IB_FROM(x) ((ib_t)(x))
#define IGROUP 1
#define IZERO() ((ivec){0, 0, 0, 0})
static inline ivec IBCAST(const uint8_t *p) { return (ivec){0, 0, 0, 0} + (int32_t)p[0]; }
#define ILOADB(pb) (*(const ivec_u *)(pb))
#define IDOT(acc, a, b) ((acc) + (a) * (b))
#define ISTOREU(p, v) (*(ivec_u *)(p) = (v))
"""


BF16_BY_FMA = """\
#include <stdint.h>
typedef vec ivec;
typedef vec ia_t;
typedef vec ibv_t;
typedef float ib_t;
#define IGROUP 1
static inline float tc_bf16_f32(uint16_t h) {
  const uint32_t x = (uint32_t)h << 16;
  float f;
  __builtin_memcpy(&f, &x, 4);
  return f;
}
#define IB_FROM(x) tc_bf16_f32(x)
#define IZERO() VZERO()
static inline vec IBCAST(const uint16_t *p) { return VSET1(tc_bf16_f32(p[0])); }
#define ILOADB(pb) VLOADU(pb)
#define IDOT(acc, a, b) VFMA((a), (b), (acc))
#define ISTOREU(p, v) VSTOREU((p), (v))
"""
"""bf16 on any dialect: B widened to float32 when packed, A per broadcast, then FMAs."""


def portable_dialect(flags: tuple[str, ...], name: str = "generic", extra: str = "") -> IsaDialect:
    """The GCC/Clang vector-extension dialect (16-byte vectors, any target those compilers
    support) with a backend's target ``flags``, named for its ISA level, ``extra`` C after
    the prelude (a target's own spelling of some of its operations)."""
    return IsaDialect(name, 4,
                      _GENERIC_PRELUDE + _GENERIC_MATH + _GENERIC_MORE + TANH_ERF + SCALAR_EXP
                      + extra, flags, LOG_CONSTANTS + _GENERIC_LOG_SPLIT + LOG, PORTABLE_INT8,
                      BF16_BY_FMA)
