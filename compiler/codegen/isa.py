"""Per-ISA vocabulary for generated C: vector type, intrinsics and compiler flags.

AVX-512 and AVX2 kernels use Intel intrinsics; the portable fallback uses GCC/Clang vector
extensions (16-byte vectors), which compile on any target those compilers support.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

# Never -ffast-math: a shared object built with it switches FTZ/DAZ on for the whole process.
# ISO dialects (-std=c11) disable FMA contraction, so use the GNU dialect and ask for it.
BASE_FLAGS = ("-O3", "-std=gnu11", "-fPIC", "-shared", "-ffp-contract=fast", "-fno-math-errno")


@dataclass(frozen=True, slots=True)
class IsaDialect:
    """How to spell vector operations on one ISA level."""

    name: str
    lanes: int
    prelude: str
    flags: tuple[str, ...]


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


def _generic_flags() -> tuple[str, ...]:
    return ("-march=x86-64",) if platform.machine() in ("x86_64", "AMD64") else ()


DIALECTS: dict[str, IsaDialect] = {
    "avx512": IsaDialect(
        "avx512", 16, _AVX512_PRELUDE,
        ("-march=x86-64-v4", "-mtune=generic", "-mprefer-vector-width=512"),
    ),
    "avx2": IsaDialect("avx2", 8, _AVX2_PRELUDE, ("-march=x86-64-v3", "-mtune=generic")),
    "generic": IsaDialect("generic", 4, _GENERIC_PRELUDE, _generic_flags()),
}


def dialect(isa: str) -> IsaDialect:
    try:
        return DIALECTS[isa]
    except KeyError:
        raise ValueError(f"no code generator for ISA {isa!r}; have {', '.join(DIALECTS)}") from None
