"""The matrix-tile (AMX) engine of the int8 and bf16 conv2d (``loop_order=amx``).

The packed input's pixels hold ``PIXC`` channels a block, one tile row of 64 bytes (64 u8
or 32 bf16), so one tile of A is 16 output pixels of a row (``KSW`` pixels apart in Xq) by a
block's channels for one tap, and one tile of B the matching ``GPB = 16`` K groups of the
packed weights by 16 output channels. A ``ow_block x oc_block`` tile of output takes
``ow_block/16 * oc_block/16`` C tiles, ``ow_block/16`` A and ``oc_block/16`` B tiles; for
every channel block and tap it loads each once and multiplies every pair. The C tiles are
stored to a buffer and finished by ``tc_q_store_block`` (the epilogue's operands held in
registers across the tile's pixels). A row
narrower than the tile reads into Xq's slack; those pixels are not stored.
"""

from __future__ import annotations

from tunecache.compiler.kinds.matmul.emit_tiles import tile_block


def _head(x_stride: str, item: str) -> str:
    """The tile strides and ``tc_q_row``'s head, its last parameter ``item``, its C buffer."""
    return (f"#define X_STRIDE ({x_stride} * (long)sizeof(ta_t))\n"
            "#define W_STRIDE (OCB * IGROUP * (long)sizeof(ib_t))\n"
            "static void tc_q_row(const ta_t *Xq, const ib_t *Wq, const float *scale,\n"
            "    const float *bias, const tadd_t *add, const float *aq, const float *chan,\n"
            f"    ty_t *Y, long n, long t, long {item}) {{\n"
            "  tacc_t out[OWB * OCB] __attribute__((aligned(64)));\n")


def tile_row(mt: int, nt: int) -> str:
    """``tc_q_row`` on ``mt x nt`` C tiles (registers 0 ..), then ``mt`` A and ``nt`` B."""
    block = tile_block(mt, nt, "xs + {r16} * KSW * PIXC, X_STRIDE",
                       "w + {t16} * IGROUP, W_STRIDE",
                       "out + {r16} * OCB + {t16}, OCB * sizeof(tacc_t)", outer=4, inner=10)
    zero, loads, dots, stores = block.zero, block.loads, block.dots, block.stores
    return (
        _head("KSW * PIXC", "oh") +
        "  for (long ow0 = 0; ow0 < Q; ow0 += OWB) {\n"
        "    const long first = Q >= OWB ? MIN(ow0, Q - OWB) : 0;\n"
        + zero +
        "    const ib_t *w = Wq + t * CB * R * KS * GPB * OCB * IGROUP;\n"
        "    for (long cb = 0; cb < CB; cb++)\n"
        "      for (long r = 0; r < R; r++)\n"
        "        for (long s = 0; s < KS; s++, w += GPB * OCB * IGROUP) {\n"
        "          const ta_t *xs = Xq + (((n * CB + cb) * HP + oh * SH + r) * KWP\n"
        "                                 + first * KSW + s) * PIXC;\n"
        + loads + dots + "        }\n" + stores +
        "    long pix[OWB];\n"
        "    for (long p = 0; p < OWB; p++)\n"
        "      pix[p] = first + p >= ow0 && first + p < Q ? oh * Q + first + p : -1;\n"
        "    tc_q_store_block(out, scale, bias, add, aq, chan, Y, n, t * OCB, pix);\n"
        "  }\n}\n")


def tile_plane(mt: int, nt: int) -> str:
    """``tc_q_row`` for a stride-1 convolution, its output seen as rows of ``WP`` pixels (the
    padded input's width, the last ``WP - Q`` of each row not stored): output pixel ``p`` of
    that plane reads Xq's pixel ``p + r * WP + s`` for tap (r, s), so 16 consecutive ones
    are one A tile ``PIXC`` apart, whatever the row width. Item ``tile`` is pixels ``tile *
    OWB ..`` of the plane: a 7x7 map (9 wide padded) computes 22% more pixels than it keeps,
    not the 56% of a 16-pixel tile a row; a 1x1's plane is its pixels, none lost. The last
    tile ends at the plane's end (over pixels the one before stored, not stored again), so
    no tile reads past the plane's last row: a 1x1 reads X in place to its last byte."""
    block = tile_block(mt, nt, "xs + {r16} * PIXC, X_STRIDE", "w + {t16} * IGROUP, W_STRIDE",
                       "out + {r16} * OCB + {t16}, OCB * sizeof(tacc_t)", outer=2, inner=8)
    zero, loads, dots, stores = block.zero, block.loads, block.dots, block.stores
    return (
        _head("PIXC", "tile") +
        "  const long p0 = P * WP >= OWB ? MIN(tile * OWB, P * WP - OWB) : tile * OWB;\n"
        + zero +
        "  const ib_t *w = Wq + t * CB * R * KS * GPB * OCB * IGROUP;\n"
        "  for (long cb = 0; cb < CB; cb++)\n"
        "    for (long r = 0; r < R; r++)\n"
        "      for (long s = 0; s < KS; s++, w += GPB * OCB * IGROUP) {\n"
        "        const ta_t *xs = Xq + (((n * CB + cb) * HP + r) * WP + p0 + s) * PIXC;\n"
        + loads + dots + "      }\n" + stores +
        "  long pix[OWB];\n"
        "  for (long p = 0; p < OWB; p++) {\n"
        "    const long oh = (p0 + p) / WP, ow = (p0 + p) % WP;\n"
        "    pix[p] = oh < P && ow < Q && p0 + p >= tile * OWB ? oh * Q + ow : -1;\n"
        "  }\n"
        "  tc_q_store_block(out, scale, bias, add, aq, chan, Y, n, t * OCB, pix);\n}\n")
