"""The matrix-tile (AMX) engine of the low-precision matmul (``loop_order=amx``).

A tile is 16 rows of 64 bytes: 16 rows of A by ``TK`` K elements (64 u8 or 32 bf16), 16
K groups of B by 16 columns, and 16 x 16 int32 or float32 of C. B is packed in 16-column
panels of all its K groups (``[N/16][K groups][16][IGROUP]``), so a B tile is 1 KiB in one
piece: in the vector kernel's ``[K groups][N][IGROUP]`` its 16 rows lay ``4 N`` bytes
apart, a multiple of 4 KiB for BERT's 3072 columns, all in one set of L1. Eight tiles: a
``mr x nr`` register tile of C takes ``mr/16 * nr/16`` of them, plus ``mr/16`` of A and
``nr/16`` of B. Each K step loads the A and B tiles once and multiplies every pair; the C
tiles are stored to a buffer on the stack and each row finished by the vector epilogue.
A's rows are packed to whole tiles of K (zero past K) in a buffer of whole ``mr`` tiles of
rows; the rows past M are never written, and their C rows never stored.
"""

from __future__ import annotations

from dataclasses import dataclass

TILE_ROWS = 16
"""Rows (and 4-byte columns) of one tile."""
TILE_BYTES = 64
"""Bytes of one tile row."""
TILE_REGISTERS = 8

TILE_SIZES = """\
#define KP ((K + TK - 1) / TK * TK)
#define KG (KP / IGROUP)
#define MP ((M + MR - 1) / MR * MR)
#define A_BYTES ((MP * KP * (long)sizeof(ta_t) + 63) / 64 * 64)
"""


TILE_PACK_B = """\
/* B (K x N) into [NP / 16][KG][16][IGROUP] of ib_t, zero-padded: each 16-column panel's K
   groups in a row, so one B tile is 1 KiB in one piece: groups [g0, g1). */
static void tc_lowp_pack_b(const tb_t *Bs, ib_t *Bp, long g0, long g1) {
  for (long g = g0; g < g1; g++)
    for (long n = 0; n < NP; n++)
      for (long t = 0; t < IGROUP; t++) {
        const long k = g * IGROUP + t;
        Bp[((n / 16 * KG + g) * 16 + n % 16) * IGROUP + t] =
            (k < K && n < N) ? IB_FROM(Bs[k * N + n]) : 0;
      }
}
"""


def tiles_used(mr: int, nr: int) -> int:
    """Tile registers an ``mr x nr`` tile of C takes with its A and B tiles."""
    mt, nt = mr // TILE_ROWS, nr // TILE_ROWS
    return mt * nt + mt + nt


@dataclass(frozen=True)
class TileBlock:
    """The C statements of an ``mt x nt`` block of C tiles (registers ``0 ..``, then ``mt``
    A tiles and ``nt`` B tiles): zero the C tiles, load A and B for one K step, multiply
    every pair, store the C tiles."""

    zero: str
    loads: str
    dots: str
    stores: str


def tile_block(mt: int, nt: int, a: str, b: str, c: str, outer: int,
               inner: int) -> TileBlock:
    """:class:`TileBlock` whose A tile ``r``'s address and stride are ``a``, B tile ``t``'s
    ``b`` and C tile ``(r, t)``'s store ``c``, formatted with ``r``, ``t`` and ``r16``,
    ``t16`` (their first row and column); zero and store statements indented ``outer``
    spaces, the K step's ``inner``."""
    cs = {(r, t): r * nt + t for r in range(mt) for t in range(nt)}
    pad, deep = " " * outer, " " * inner

    def at(template: str, r: int = 0, t: int = 0) -> str:
        return template.format(r=r, t=t, r16=r * TILE_ROWS, t16=t * TILE_ROWS)

    return TileBlock(
        zero="".join(f"{pad}TZERO({cs[k]});\n" for k in sorted(cs)),
        loads="".join(f"{deep}TLOAD({mt * nt + r}, {at(a, r=r)});\n" for r in range(mt))
        + "".join(f"{deep}TLOAD({mt * nt + mt + t}, {at(b, t=t)});\n" for t in range(nt)),
        dots="".join(f"{deep}TDOT({cs[r, t]}, {mt * nt + r}, {mt * nt + mt + t});\n"
                     for r in range(mt) for t in range(nt)),
        stores="".join(f"{pad}TSTORE({cs[r, t]}, {at(c, r, t)});\n"
                       for r in range(mt) for t in range(nt)))


_PREFETCH = """\
/* Every line of a B tile requested at once, just before the tile load: a model's weights
   come from memory, and the load alone fetches its 16 lines a few at a time (BERT-base's
   128x768x768 bf16, weights cold: 0.267 -> 0.215 ms; 128x768x3072 1.00 -> 0.92; one
   thread, AMX Xeon). Further ahead (1 or 2 K steps) did no better than none. */
#define TC_PREFETCH_TILE(p) \\
  for (int line = 0; line < 16; line++) \\
    __builtin_prefetch((const char *)(p) + 64 * line, 0, 3)
"""


def tile_rows(mt: int, nt: int) -> str:
    """``tc_lowp_rows`` on tiles: rows ``i0 .. i0 + MR`` of C, panels ``j0 .. j1``, with
    ``mt x nt`` C tiles (registers 0 ..), then ``mt`` A tiles and ``nt`` B tiles."""
    block = tile_block(mt, nt, "a + {r16} * KP + k, KP * sizeof(ta_t)",
                       "bk + {t} * KG * 16 * IGROUP, B_STRIDE",
                       "out + {r16} * NR + {t16}, NR * sizeof(tacc_t)", outer=4, inner=6)
    zero, loads, dots, stores = block.zero, block.loads, block.dots, block.stores
    return (
        "#define B_STRIDE (16 * IGROUP * (long)sizeof(ib_t))\n" + _PREFETCH +
        "static void tc_lowp_rows(const ta_t *Ap, const ib_t *Bp, tc_t *C, const float *scale,\n"
        "    const float *bias, const float *chan, long i0, long j0, long j1) {\n"
        "  const long rows = MIN(MR, M - i0);\n"
        "  const ta_t *a = Ap + i0 * KP;\n"
        "  tacc_t out[MR * NR] __attribute__((aligned(64)));\n"
        "  for (long j = j0; j < j1; j += NR) {\n"
        + zero +
        "    for (long k = 0; k < KP; k += TK) {\n"
        "      const ib_t *bk = Bp + (j / 16 * KG + k / IGROUP) * 16 * IGROUP;\n"
        + "".join(f"      TC_PREFETCH_TILE(bk + {t} * KG * 16 * IGROUP);\n"
                  for t in range(nt))
        + loads + dots + "    }\n" + stores +
        "    const long width = MIN(NR, N - j);\n"
        "    for (long r = 0; r < rows; r++)\n"
        "      tc_lowp_finish(out + r * NR, C + (i0 + r) * N + j, j, width, scale, bias, chan);\n"
        "  }\n}\n")
