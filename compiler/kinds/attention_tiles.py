"""The bf16 attention kernel on matrix tiles (AMX): ``score=tiles``.

A ``bf16`` attention op reads and writes float32 Q, K, V and Y like the float32 one, and
multiplies in bfloat16 with float32 sums: ``Q K^T`` and ``P V`` are tile products, the
softmax between them float32 vectors. Per batch item, a thread rounds K and V to bfloat16
once, each into the B-tile layout of its product (16-column panels of bfloat16 pairs:
``[NP / 16][DP / 2][16][2]`` for ``K^T``, whose K dim is the head dim, and
``[DVP / 32 * 2][NP / 2][16][2]`` for ``V``, whose K dim is the keys); then for each block
of ``q_block`` query rows (16 or 32: whole tiles of rows):

1. the block's queries times the scale, rounded to bfloat16 (rows past M zero; a Q taken
   as bfloat16, ``narrow=q``, is copied and its scale applied to the scores instead);
2. scores ``S = Qs K^T`` for the keys the block sees, ``k_block`` keys (16 or 32) a tile
   step, stored as float32 rows of ``NP``;
3. per row, the softmax of its visible scores (mask added) in float32, ``P = exp(S - max)``
   rounded to bfloat16 into A-tile rows (0 past the row's last visible key) and its float32
   sum ``l``;
4. ``O = P V`` in 32-column passes (2 x 2 C tiles at most: 8 tile registers), then
   ``Y = O / l`` (0 where ``l = 0``: every key masked to ``-inf``).

Unlike the float32 kernel it keeps a whole row of scores (no online softmax): ``4 q_block
NP`` bytes, 16 KiB for 32 rows of 128 keys. Products sum bfloat16 values exactly in float32;
the error against float32 is the rounding of Qs, K, P and V (relative ``2**-9`` each).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from tunecache.compiler.codegen.abi import HEADER, TIMER, WORKSPACE, defines, parallel_entry, unpack_args
from tunecache.compiler.codegen.isa import BF16_SCALAR, IsaDialect
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import narrow_tensors
from tunecache.compiler.kinds.matmul import tile_dtypes
from tunecache.compiler.kinds.matmul.emit_tiles import TILE_ROWS, tile_block, tiles_used
from tunecache.compiler.mathutil import round_up
from tunecache.compiler.ops import OpSignature

__all__ = ["NARROW", "TILE_K_BLOCKS", "TILE_Q_BLOCKS", "TileView", "emit_attention_tiles",
           "tile_problems", "tile_workspace_bytes", "tiles_fit",
           "with_narrow"]

NARROW = ("none", *("+".join(c) for r in (1, 2, 3) for c in combinations("qkv", r)))
"""Which of Q, K and V a bf16 attention takes as bfloat16 (its projections' outputs, rounded
there rather than here)."""
TILE_Q_BLOCKS = (16, 32)
"""Query rows per block on tiles: one or two tiles of rows."""
TILE_K_BLOCKS = (16, 32)
"""Keys per score step on tiles: one or two tiles of columns."""
_PAIR_ROWS = 32
"""Elements of a K step (a tile row's 64 bytes of bfloat16): P's keys and Q's head dim are
padded to whole steps."""
_PV_COLUMNS = 2 * TILE_ROWS


def tiles_fit(q_block: int, k_block: int) -> bool:
    """Whether the score step's C, A and B tiles (and so the ``P V`` pass's) fit the eight
    tile registers."""
    return max(tiles_used(q_block, k_block), tiles_used(q_block, _PV_COLUMNS)) <= 8


def tile_problems(op: OpSignature, q_block: int, k_block: int, score: str,
                  hw: HardwareSpec) -> list[str]:
    """Why ``score=tiles`` cannot run ``op`` with these blocks on ``hw``: a bf16 op, bf16
    matrix tiles, whole tiles of query rows and keys that fit the tile registers."""
    found: list[str] = []
    if op.dtype != "bf16" or score != "tiles":
        found.append(f"score=tiles is the bf16 attention's kernel, and a bf16 attention runs "
                     f"on score=tiles only; got dtype={op.dtype}, score={score}")
    if op.dtype not in tile_dtypes(hw):
        found.append(f"a bf16 attention needs bf16 matrix tiles (AMX-BF16); {hw.hw_id} has none")
    if q_block not in TILE_Q_BLOCKS or k_block not in TILE_K_BLOCKS:
        found.append(f"score=tiles takes q_block in {TILE_Q_BLOCKS} and k_block in "
                     f"{TILE_K_BLOCKS}; got q_block={q_block}, k_block={k_block}")
    elif not tiles_fit(q_block, k_block):
        found.append(f"q_block={q_block}, k_block={k_block} need more than the 8 tile "
                     "registers")
    elif q_block > TILE_Q_BLOCKS[0] and q_block // 2 >= op.dim("M"):
        found.append(f"q_block={q_block} is over twice M={op.dim('M')}: "
                     f"q_block={q_block // 2} already covers every query")
    return found


def _sizes(op: OpSignature, q_block: int, dv: int) -> dict[str, int]:
    """Bytes of one thread's workspace regions, each a multiple of 64."""
    n_pad = round_up(op.dim("N"), _PAIR_ROWS)
    d_pad, dv_pad = round_up(op.dim("D"), _PAIR_ROWS), round_up(dv, _PV_COLUMNS)
    return {"KP": 2 * n_pad * d_pad, "VP": 2 * n_pad * dv_pad, "QA": 2 * q_block * d_pad,
            "SC": 4 * q_block * n_pad, "PA": 2 * q_block * n_pad, "O": 4 * q_block * dv_pad}


def with_narrow(op: OpSignature, tensors: frozenset[str]) -> OpSignature | None:
    """``OpKind.with_narrow``: a bf16 attention taking ``tensors`` (``q``, ``k``, ``v``) and
    those it took as bfloat16; None for anything else."""
    if op.dtype != "bf16" or not tensors <= {"q", "k", "v"}:
        return None
    held = narrow_tensors(op) | tensors
    text = "+".join(t for t in "qkv" if t in held)
    return OpSignature(op.kind, op.dims, op.dtype,
                       tuple((k, text if k == "narrow" else v) for k, v in op.attrs),
                       op.epilogue)


def tile_workspace_bytes(op: OpSignature, q_block: int, dv: int) -> int:
    """One thread's workspace on tiles: packed K and V, the block's queries, scores, P and
    the output rows."""
    return sum(_sizes(op, q_block, dv).values())


def _offsets(op: OpSignature, q_block: int, dv: int) -> dict[str, int]:
    out, at = {}, 0
    for name, size in _sizes(op, q_block, dv).items():
        out[f"OFF_{name}"] = at
        at += size
    out["WS_THREAD"] = at // 4
    return out


_HELPERS = """\
typedef struct { const q_t *q; const k_t *k; const v_t *v; const float *mask; float *y;
                 float scale; } attn_args;

/* x[0 .. n) times s, rounded to bfloat16, into out[0 .. npad) (zeros past n). */
static inline void round_row(const float *restrict x, long n, float s, uint16_t *restrict out,
                             long npad) {
  const vec sv = VSET1(s);
  long i = 0;
  for (; i + LANES <= n; i += LANES) VSTORE_BF16(out + i, VMUL(VLOADU(x + i), sv));
  for (; i < n; i++) out[i] = tc_bf16_round(x[i] * s);
  for (; i < npad; i++) out[i] = 0;
}

/* x[0 .. n), bfloat16 already, into out[0 .. npad) (zeros past n); s is not applied. */
static inline void copy_row(const uint16_t *restrict x, long n, float s,
                            uint16_t *restrict out, long npad) {
  (void)s;
  memcpy(out, x, sizeof(uint16_t) * (size_t)n);
  for (long i = n; i < npad; i++) out[i] = 0;
}

/* K of one item as B tiles of S = Qs K^T: key j, element pair g at
   kp[(j / 16 * (DP / 2) + g) * 16 + j % 16]; zero past N and D. */
static void pack_k(const k_t *restrict kmat, uint32_t *restrict kp) {
  uint16_t row[DP] __attribute__((aligned(64)));
  uint32_t pairs[DP / 2];
  for (long j = 0; j < NP; j++) {
    if (j < N) K_ROW(kmat + j * KS, D, 1.0f, row, DP);
    else memset(row, 0, sizeof row);
    memcpy(pairs, row, sizeof row);
    uint32_t *restrict panel = kp + j / 16 * (DP / 2) * 16 + j % 16;
    for (long g = 0; g < DP / 2; g++) panel[g * 16] = pairs[g];
  }
}

/* V of one item as B tiles of O = P V: keys 2g and 2g + 1, column c at
   vp[(c / 16 * (NP / 2) + g) * 16 + c % 16]; zero past N and DV. */
static void pack_v(const v_t *restrict vmat, uint32_t *restrict vp) {
  uint16_t r0[DVP] __attribute__((aligned(64))), r1[DVP] __attribute__((aligned(64)));
  for (long g = 0; g < NP / 2; g++) {
    if (2 * g < N) V_ROW(vmat + 2 * g * VS, DV, 1.0f, r0, DVP);
    else memset(r0, 0, sizeof r0);
    if (2 * g + 1 < N) V_ROW(vmat + (2 * g + 1) * VS, DV, 1.0f, r1, DVP);
    else memset(r1, 0, sizeof r1);
    for (long c = 0; c < DVP; c++)
      vp[(c / 16 * (NP / 2) + g) * 16 + c % 16] = (uint32_t)r0[c] | ((uint32_t)r1[c] << 16);
  }
}
"""

_SOFTMAX = """\
/* Row s's softmax over its n visible scores (mk: the mask from key 0, or NULL) as bfloat16
   P into p[0 .. np) (zero past n); returns the float32 sum (0: no finite score). With
   SCALE_SCORES (Q taken as bfloat16, unscaled) the scores are scaled here first. */
static float softmax_row(const float *restrict s, const float *restrict mk, long n,
                         uint16_t *restrict p, long np, float scale) {
  float *restrict z = (float *)s;
  const vec sv = VSET1(scale);
  vec mx = VSET1(NEG_INF);
  long j = 0;
  for (; j + LANES <= n; j += LANES) {
    vec v = VLOADU(z + j);
    if (SCALE_SCORES) v = VMUL(v, sv);
    if (mk) v = VADD(v, VLOADU(mk + j));
    if (SCALE_SCORES || mk) VSTOREU(z + j, v);
    mx = VMAX(mx, v);
  }
  if (j < n) {
    const int t = (int)(n - j);
    vec v = VLOADU_PART(z + j, t);
    if (SCALE_SCORES) v = VMUL(v, sv);
    if (mk) v = VADD(v, VLOADU_PART(mk + j, t));
    if (SCALE_SCORES || mk) VSTOREU_PART(z + j, v, t);
    mx = VMAX(mx, VFILL_PART(v, t, NEG_INF));
  }
  const float top = n > 0 ? VHMAX(mx) : NEG_INF;
  if (top == NEG_INF) { memset(p, 0, sizeof(uint16_t) * (size_t)np); return 0.0f; }
  const vec tv = VSET1(top);
  vec sum = VZERO();
  for (j = 0; j + LANES <= n; j += LANES) {
    const vec e = VEXP(VSUB(VLOADU(z + j), tv));
    VSTORE_BF16(p + j, e);
    sum = VADD(sum, e);
  }
  if (j < n) {
    const int t = (int)(n - j);
    const vec e = VFILL_PART(VEXP(VSUB(VLOADU_PART(z + j, t), tv)), t, 0.0f);
    float part[LANES] __attribute__((aligned(64)));
    VSTOREU(part, e);
    for (long i = 0; i < t; i++) p[j + i] = tc_bf16_round(part[i]);
    sum = VADD(sum, e);
  }
  for (j = n; j < np; j++) p[j] = 0;
  return VHSUM(sum);
}
"""


@dataclass(frozen=True)
class TileView:
    """What the tile kernel needs of an attention op that the kind module works out: the
    head dim of V, whether the mask is causal, additive or per query row (``full``), and
    the ``<T>BASE(b)`` / ``<T>S`` addressing of Q, K, V and Y (head- or token-major)."""

    dv: int
    causal: bool
    masked: bool
    full: bool
    addressing: tuple[tuple[str, int | str], ...]


class _TileEmitter:
    """C of one bf16 attention kernel on tiles."""

    def __init__(self, op: OpSignature, q_block: int, k_block: int, threads: int,
                 d: IsaDialect, view: TileView) -> None:
        self.op, self.q_block, self.k_block, self.threads, self.d = (op, q_block, k_block,
                                                                     threads, d)
        self.view = view
        self.dv, self.causal, self.masked, self.full = (view.dv, view.causal, view.masked,
                                                        view.full)

    def constants(self) -> dict[str, int | str]:
        op, dims = self.op, self.op.dims_dict
        out: dict[str, int | str] = {
            "B": dims["B"], "M": dims["M"], "N": dims["N"], "D": dims["D"], "DV": self.dv,
            "HEADS": max(dims["heads"], 1), "LANES": self.d.lanes, "QB": self.q_block,
            "KB": self.k_block, "NQB": -(-dims["M"] // self.q_block),
            "NP": round_up(dims["N"], _PAIR_ROWS), "DP": round_up(dims["D"], _PAIR_ROWS),
            "DVP": round_up(self.dv, _PV_COLUMNS), "SHIFT": dims["N"] - dims["M"],
            "MASK_DIV": dims["B"] // dims["mask_rows"] if self.masked else 1,
            "NEG_INF": "(-__builtin_inff())",
            "DEFAULT_SCALE": f"{float(np.float32(1.0 / math.sqrt(dims['D'])))!r}f",
        }
        out.update(_offsets(op, self.q_block, self.dv))
        out.update(self.view.addressing)
        return out

    def scores(self) -> list[str]:
        mt, nt = self.q_block // TILE_ROWS, self.k_block // TILE_ROWS
        block = tile_block(mt, nt, "qa + {r16} * DP + d, DP * 2",
                           "kp + ((j + {t16}) / 16 * (DP / 2) + d / 2) * 32, 64",
                           "sc + {r16} * NP + j + {t16}, NP * 4", outer=2, inner=4)
        return ["for (long j = 0; j < ks; j += KB) {", block.zero.rstrip("\n"),
                "  for (long d = 0; d < DP; d += 32) {", block.loads + block.dots.rstrip("\n"),
                "  }", block.stores.rstrip("\n"), "}"]

    def products(self) -> list[str]:
        mt = self.q_block // TILE_ROWS
        block = tile_block(mt, _PV_COLUMNS // TILE_ROWS, "pa + {r16} * NP + k, NP * 2",
                           "vp + ((c + {t16}) / 16 * (NP / 2) + k / 2) * 32, 64",
                           "o + {r16} * DVP + c + {t16}, DVP * 4", outer=2, inner=4)
        return ["for (long c = 0; c < DVP; c += 32) {", block.zero.rstrip("\n"),
                "  for (long k = 0; k < kp32; k += 32) {", block.loads + block.dots.rstrip("\n"),
                "  }", block.stores.rstrip("\n"), "}"]

    def block(self) -> str:
        lim = "MIN(N, i0 + r + SHIFT + 1)" if self.causal else "N"
        kend = "MIN(N, i0 + rows + SHIFT)" if self.causal else "N"
        mask = ("a->mask + ((b / MASK_DIV) * M + i0 + r) * N" if self.full else
                "a->mask + (b / MASK_DIV) * N" if self.masked else "NULL")
        body = [
            "const uint16_t *restrict kp = (const uint16_t *)(w + OFF_KP);",
            "const uint16_t *restrict vp = (const uint16_t *)(w + OFF_VP);",
            "uint16_t *restrict qa = (uint16_t *)(w + OFF_QA);",
            "float *restrict sc = (float *)(w + OFF_SC);",
            "uint16_t *restrict pa = (uint16_t *)(w + OFF_PA);",
            "float *restrict o = (float *)(w + OFF_O);",
            "const long rows = MIN(QB, M - i0);",
            "for (long r = 0; r < QB; r++) {",
            "  if (r < rows) Q_ROW(a->q + QBASE(b) + (i0 + r) * QS, D, a->scale, "
            "qa + r * DP, DP);",
            "  else memset(qa + r * DP, 0, DP * sizeof(uint16_t));",
            "}",
            f"const long kend = {kend};",
            "const long ks = (kend + KB - 1) / KB * KB, kp32 = (kend + 31) / 32 * 32;",
            *self.scores(),
            "float l[QB];",
            "for (long r = 0; r < QB; r++)",
            f"  l[r] = r < rows ? softmax_row(sc + r * NP, {mask}, {lim}, pa + r * NP, kp32, "
            "a->scale)",
            "                   : (memset(pa + r * NP, 0, kp32 * sizeof(uint16_t)), 0.0f);",
            *self.products(),
            "for (long r = 0; r < rows; r++) {",
            "  float *restrict y = a->y + YBASE(b) + (i0 + r) * YS;",
            "  const float *restrict orow = o + r * DVP;",
            "  const vec inv = VSET1(l[r] > 0.0f ? 1.0f / l[r] : 0.0f);",
            "  long c = 0;",
            "  for (; c + LANES <= DV; c += LANES) VSTOREU(y + c, VMUL(VLOADU(orow + c), inv));",
            "  if (c < DV) VSTOREU_PART(y + c, VMUL(VLOADU(orow + c), inv), (int)(DV - c));",
            "}",
        ]
        return ("static void attn_block(const attn_args *restrict a, char *restrict w, long b, "
                "long i0) {\n" + "".join(f"  {line}\n" for line in body) + "}\n")

    def part(self) -> str:
        return (
            "static void attn_part(const attn_args *a, float *ws, int tid, int nth) {\n"
            "  long lo, hi;\n  split_range(B * NQB, tid, nth, &lo, &hi);\n"
            "  char *w = (char *)(ws + tid * WS_THREAD);\n  long packed = -1;\n"
            "  TCONFIG();\n"
            "  for (long item = lo; item < hi; item++) {\n"
            "    const long b = item / NQB;\n"
            "    if (b != packed) {\n"
            "      pack_k(a->k + KBASE(b), (uint32_t *)(w + OFF_KP));\n"
            "      pack_v(a->v + VBASE(b), (uint32_t *)(w + OFF_VP));\n"
            "      packed = b;\n    }\n"
            "    attn_block(a, w, b, item % NQB * QB);\n  }\n"
            "  TRELEASE();\n}\n")

    def element_types(self) -> str:
        """``q_t``/``Q_ROW`` and the like per input: float32 rounded (Q scaled first), or
        bfloat16 copied (Q's scale then applied to the scores: ``SCALE_SCORES``)."""
        held = narrow_tensors(self.op)
        lines = [f"typedef {'uint16_t' if t in held else 'float'} {t}_t;\n"
                 f"#define {t.upper()}_ROW {'copy_row' if t in held else 'round_row'}\n"
                 for t in "qkv"]
        return "".join(lines) + f"#define SCALE_SCORES {int('q' in held)}\n"

    def unit(self) -> str:
        unpack = unpack_args(self.op, optional=("scale", "mask"))
        entry = ("int tc_kernel(void **args) {\n" + unpack
                 + "  const attn_args a = {(const q_t *)Q, (const k_t *)K, (const v_t *)V, mask, Y,\n"
                 "                       scale ? scale[0] : DEFAULT_SCALE};\n"
                 + parallel_entry(self.threads, "attn_part(&a, ws, TID, NTH);",
                                  f"{self.threads}L * WS_THREAD"))
        d = self.d
        return "\n".join([d.prelude, HEADER, "#include <stdint.h>", d.bf16,
                          d.tile_vocabulary("bf16"), defines(self.constants()),
                          self.element_types(), WORKSPACE,
                          BF16_SCALAR, _HELPERS, _SOFTMAX, self.block(), self.part(), entry, TIMER])


def emit_attention_tiles(op: OpSignature, q_block: int, k_block: int, threads: int,
                         d: IsaDialect, view: TileView) -> str:
    """The C translation unit of the bf16 attention ``op`` on tiles (schedule validated by
    the caller; ``view`` from the kind module)."""
    return _TileEmitter(op, q_block, k_block, threads, d, view).unit()
