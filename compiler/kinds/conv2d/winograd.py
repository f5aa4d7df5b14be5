"""Winograd F(m x m, 3 x 3) for 3x3 stride-1 convolutions on blocked layouts (and on NCHW,
through a blocked copy of the input and lane-by-lane stores of the output).

``algorithm="winograd"`` computes each ``m x m`` output tile from an ``a x a`` input patch
(``a = m + 2``) with ``a*a`` multiplications per channel pair instead of ``9*m*m``: 2.25x
fewer for ``m=2``, 4x fewer for ``m=4`` (Lavin and Gray, "Fast Algorithms for Convolutional
Neural Networks", 2016; the transform matrices below are theirs, checked in
``tests/test_conv2d_winograd.py``). Three phases per chunk of tiles:

1. *input transform*: every (tile, channel block) patch becomes ``a*a`` vectors
   ``V[t][tile][C] = (Bt d B)[t]``; the lanes of a blocked layout are channels, so the
   transform is vector arithmetic on whole blocks;
2. ``a*a`` independent GEMMs ``M[t] (tiles x F) = V[t] (tiles x C) @ U[t] (C x F)`` with the
   register micro-kernel every outer-product tile shares (tiles broadcast, output channels
   in the vectors);
3. *output transform*: ``At M A`` per (tile, output block), then the fused epilogue, stored
   into the blocked output.

``U = G g Gt`` is the weights' transform, computed in double precision when the weights are
packed (once per compiled model). Knobs (see ``space.py``): ``oh_block`` is ``m``,
``ow_block`` the tiles of a register tile, ``oc_block`` its output channels (whole vectors),
``ic_block`` the input's channel block; ``threads`` split each phase, with a barrier
between phases. Grouped convolutions (not depthwise; each group's channels whole blocks)
run one GEMM per (t, group) on the group's slice of V's channels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from tunecache.compiler.codegen.abi import ALIGN_FLOATS, preamble
from tunecache.compiler.codegen.epilogue import render, scalar_helpers
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.codegen.microkernel import Loop, Store, Tile, micro_kernel
from tunecache.compiler.kinds.conv2d.common import conv2d_entries, shape_constants
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule
from tunecache.compiler.kinds.layouts import channel_block
from tunecache.compiler.kinds.reorder import blocked_copy
from tunecache.compiler.mathutil import round_up as _round_up
from tunecache.compiler.ops import OpSignature

Matrix = tuple[tuple[Fraction, ...], ...]

# Working set of one chunk of tiles (its V and M slabs): beyond it, tiles are taken in chunks
# and U is streamed once per chunk.
CHUNK_BYTES = 2 << 20


def _m(rows: Sequence[Sequence[int | Fraction]]) -> Matrix:
    return tuple(tuple(Fraction(x) for x in row) for row in rows)


_H, _S, _T = Fraction(1, 2), Fraction(1, 6), Fraction(1, 12)
# (Bt, G, At) per m: input, weight and output transforms.
_TRANSFORMS: dict[int, tuple[Matrix, Matrix, Matrix]] = {
    2: (_m([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]),
        _m([[1, 0, 0], [_H, _H, _H], [_H, -_H, _H], [0, 0, 1]]),
        _m([[1, 1, 1, 0], [0, 1, -1, -1]])),
    4: (_m([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]),
        _m([[Fraction(1, 4), 0, 0], [-_S, -_S, -_S], [-_S, _S, -_S],
            [Fraction(1, 24), _T, _S], [Fraction(1, 24), -_T, _S], [0, 0, 1]]),
        _m([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
            [0, 1, -1, 8, -8, 1]])),
}


def transforms(m: int) -> tuple[Matrix, Matrix, Matrix]:
    """(Bt, G, At) of F(m x m, 3 x 3) as exact fractions."""
    return _TRANSFORMS[m]


def transform_ops(m: int) -> tuple[int, int]:
    """Vector operations of one input patch's and one output tile's transform (nonzero terms
    of the two one-dimensional passes), for cost estimates."""
    bt, _, at = transforms(m)
    a = m + 2
    nz_b = sum(1 for row in bt for x in row if x)
    nz_a = sum(1 for row in at for x in row if x)
    return 2 * a * nz_b, a * nz_a + m * nz_a


@dataclass(frozen=True, slots=True)
class WinogradPlan:
    """Sizes of one winograd kernel (floats unless named otherwise)."""

    m: int
    alpha: int
    block: int
    tiles_h: int
    tiles_w: int
    tiles: int
    chunk: int
    nfb: int
    """Output-channel tiles per group."""
    fpg: int
    """Output columns of M per group (``nfb * oc_block``: whole tiles)."""
    fp: int
    """Output columns of M (``groups * fpg``)."""
    u_floats: int
    v_floats: int
    m_floats: int
    xb_floats: int
    """The blocked copy of an NCHW input (0 when the input is blocked already)."""


def winograd_plan(op: OpSignature, s: Conv2dSchedule) -> WinogradPlan:
    """Tiles, the chunk of tiles one pass of the three phases covers, and buffer sizes."""
    d = op.dims_dict
    m = s.oh_block
    alpha = m + 2
    tiles_h, tiles_w = -(-op.out_h // m), -(-op.out_w // m)
    tiles = d["N"] * tiles_h * tiles_w
    groups = d["groups"]
    nfb = -(-d["F"] // groups // s.oc_block)
    fpg = nfb * s.oc_block
    fp = groups * fpg
    nt = s.ow_block
    per_tile = 4 * alpha * alpha * (d["C"] + fp)
    chunk = max(nt, CHUNK_BYTES // per_tile // nt * nt)
    chunk = min(chunk, _round_up(tiles, nt))
    block = channel_block(op.attr("layout"))
    xb_floats = 0 if block else d["N"] * d["C"] * d["H"] * d["W"]
    return WinogradPlan(m, alpha, block or s.ic_block, tiles_h, tiles_w, tiles, chunk, nfb,
                        fpg, fp, alpha * alpha * d["C"] // groups * fp,
                        alpha * alpha * chunk * d["C"], alpha * alpha * chunk * fp, xb_floats)


def _c(x: Fraction) -> str:
    return f"{float(x)!r}f"


def _combine(coefs: Sequence[Fraction], terms: Sequence[str]) -> str:
    """A vector expression of sum(c * x) over the nonzero coefficients (a +1 term first)."""
    pairs = sorted(((c, t) for c, t in zip(coefs, terms, strict=True) if c),
                   key=lambda p: p[0] != 1)
    if not pairs:
        return "VZERO()"
    c0, t0 = pairs[0]
    expr = t0 if c0 == 1 else f"VMUL(VSET1({_c(c0)}), {t0})"
    for c, t in pairs[1:]:
        if c == 1:
            expr = f"VADD({expr}, {t})"
        elif c == -1:
            expr = f"VSUB({expr}, {t})"
        else:
            expr = f"VFMA(VSET1({_c(c)}), {t}, {expr})"
    return expr


def _two_sided(mat: Matrix, src: Callable[[int, int], str], name: str) -> list[str]:
    """C lines computing ``name{i}_{j} = (mat @ X @ mat.T)[i][j]`` for X given by ``src``."""
    rows, cols = len(mat), len(mat[0])
    lines = [f"  const vec {name}t{i}_{c} = "
             f"{_combine(mat[i], [src(k, c) for k in range(cols)])};"
             for i in range(rows) for c in range(cols)]
    lines += [f"  const vec {name}{i}_{j} = "
              f"{_combine(mat[j], [f'{name}t{i}_{c}' for c in range(cols)])};"
              for i in range(rows) for j in range(rows)]
    return lines


def _input_tile(m: int, alpha: int) -> str:
    """``input_tile``: one (tile, channel vector) patch of the blocked input (pixels ``XB``
    floats apart), zero outside it, transformed into its ``a*a`` vectors at ``vb`` (vector t
    at ``vb + t * CHUNK * C``)."""
    bt = transforms(m)[0]
    body = _two_sided(bt, lambda k, j: f"VLOADU(p + {k} * rs + {j} * cs)", "v")
    stores = [f"  VSTOREU(vb + {i * alpha + j}L * CHUNK * C, v{i}_{j});"
              for i in range(alpha) for j in range(alpha)]
    return "\n".join([
        "static void input_tile(const float *restrict xc, float *restrict vb, long h0, "
        "long w0) {",
        "  float patch[ALPHA * ALPHA * VL] __attribute__((aligned(64)));",
        "  const float *p = xc + (h0 * W + w0) * XB;",
        "  long rs = W * XB, cs = XB;",
        "  if (h0 < 0 || w0 < 0 || h0 + ALPHA > H || w0 + ALPHA > W) {",
        "    for (long a = 0; a < ALPHA; a++)",
        "      for (long b = 0; b < ALPHA; b++) {",
        "        const long ih = h0 + a, iw = w0 + b;",
        "        const int inside = ih >= 0 && ih < H && iw >= 0 && iw < W;",
        "        VSTORE(patch + (a * ALPHA + b) * VL,",
        "               inside ? VLOADU(xc + (ih * W + iw) * XB) : VZERO());",
        "      }",
        "    p = patch; rs = ALPHA * VL; cs = VL;",
        "  }",
        *body,
        *stores,
        "}",
    ])


def _output_tile(op: OpSignature, m: int, alpha: int, nchw: bool) -> str:
    """``output_tile``: one (tile, output vector ``fo``) of M transformed back to ``m x m``
    output vectors, with the epilogue, stored where they fall inside the output: whole
    vectors into a blocked Y, lane by lane (channels ``P*Q`` floats apart) into an NCHW Y."""
    at = transforms(m)[2]
    body = _two_sided(at, lambda k, j: f"VLOADU(mb + {k * alpha + j}L * CHUNK * FP)", "y")
    add = "gather(add + off)" if nchw else "VLOADU(add + off)"
    epi = render(op.epilogue, "t", {"bias": "bv", "add": add}, vector=True)
    put = "scatter(Y + off, t);" if nchw else "VSTOREU(Y + off, t);"
    pixel = "1" if nchw else "XB"
    stores = [f"  if (p0 + {i} < P && q0 + {j} < Q) {{ const long off = yoff + ({i} * Q + {j})"
              f" * {pixel}; vec t = y{i}_{j}; {epi} {put} }}"
              for i in range(m) for j in range(m)]
    yoff = ("((n * F + fo * VL) * P + p0) * Q + q0" if nchw else
            "(((n * F / XB + fo / VPB) * P + p0) * Q + q0) * XB + (fo % VPB) * VL")
    lanes = _NCHW_LANES if nchw else ""
    return lanes + "\n".join([
        "static void output_tile(const float *restrict mb, float *restrict Y, "
        "const float *restrict bias, const float *restrict add, long n, long fo, "
        "long p0, long q0) {",
        "  (void)bias; (void)add;",
        f"  const long yoff = {yoff};",
        "  const vec bv = bias ? VLOADU(bias + fo * VL) : VZERO(); (void)bv;",
        *body,
        *stores,
        "}",
    ])


# An NCHW tensor holds one output vector's channels P*Q floats apart.
_NCHW_LANES = """\
static inline vec gather(const float *restrict src) {
  float lane[VL] __attribute__((aligned(64)));
  for (long l = 0; l < VL; l++) lane[l] = src[l * P * Q];
  return VLOAD(lane);
}
static inline void scatter(float *restrict dst, vec v) {
  float lane[VL] __attribute__((aligned(64)));
  VSTORE(lane, v);
  for (long l = 0; l < VL; l++) dst[l * P * Q] = lane[l];
}
"""

def _gemm_ukr(nt: int, nv: int, lanes: int) -> str:
    """NT tiles (broadcast rows of V[t]) x OCB output channels (vectors of U[t])."""
    tile = Tile(tuple(str(r) for r in range(nt)), nv, lanes)
    spec = Store(tuple(f"mb + {r} * FP" for r in range(nt)))
    return micro_kernel(
        "static inline void ukr(const float *restrict vb, const float *restrict ub, "
        "float *restrict mb)", tile, [Loop("for (long c = 0; c < CG; c++)", unroll=4)],
        "VLOAD(ub + c * OCB + {o})", [f"vb[{r} * C + c]" for r in range(nt)], spec)


def _pack_weights(g: Matrix) -> str:
    """``pack_weights``: U[t][g][fb][c][OCB] = (G w G^T)[t] in double precision (``c`` a
    channel of group ``g``), zero for a group's output channels beyond FG. Items: output
    columns of M (each group padded to whole OCB tiles)."""
    rows = ", ".join("{" + ", ".join(f"{float(x)!r}" for x in row) + "}" for row in g)
    return f"""\
static const double WG[ALPHA][3] = {{{rows}}};
/* Not inlined: the pre-packed and the per-call paths must round alike. */
__attribute__((noinline))
static void pack_weights(const float *restrict Wt, float *restrict Ub, long lo, long hi) {{
  for (long col = lo; col < hi; col++)
    for (long c = 0; c < CG; c++) {{
      const long g = col / FPG, fl = col % FPG, f = g * FG + fl;
      double t[ALPHA][3];
      const float *w = Wt + (f * CG + c) * 9;
      for (long i = 0; i < ALPHA; i++)
        for (long b = 0; b < 3; b++) {{
          t[i][b] = 0.0;
          if (fl < FG) for (long a = 0; a < 3; a++) t[i][b] += WG[i][a] * (double)w[a * 3 + b];
        }}
      for (long i = 0; i < ALPHA; i++)
        for (long j = 0; j < ALPHA; j++) {{
          double u = 0.0;
          for (long b = 0; b < 3; b++) u += t[i][b] * WG[j][b];
          Ub[((((i * ALPHA + j) * G + g) * NFB + fl / OCB) * CG + c) * OCB + fl % OCB] =
              (float)u;
        }}
    }}
}}
"""


_BODY = """\
static void conv_body(const float *X, const float *restrict Wt,
                      const float *restrict bias, const float *restrict add, float *restrict Y,
                      float *ws, int tid, int nth, int packed) {
  float *Vb = ws, *Mb = ws + OFF_M;
  const float *Ub = packed ? Wt : ws + OFF_U;
  if (!packed) {
    long lo, hi; split_range(FP, tid, nth, &lo, &hi); pack_weights(Wt, ws + OFF_U, lo, hi);
  }
#if NCHW_IN
  to_blocked(X, ws + OFF_X, tid, nth);
  X = ws + OFF_X;
#endif
  BARRIER();
  for (long t0 = 0; t0 < TILES; t0 += CHUNK) {
    const long count = MIN(CHUNK, TILES - t0), rows = (count + NT - 1) / NT * NT;
    long lo, hi;
    split_range(rows * CBX, tid, nth, &lo, &hi);
    for (long it = lo; it < hi; it++) {
      const long k = it / CBX, cb = it % CBX;
      float *vb = Vb + k * C + cb * VL;
      if (k >= count) {
        for (long t = 0; t < ALPHA * ALPHA; t++) VSTOREU(vb + t * CHUNK * C, VZERO());
        continue;
      }
      const long g = t0 + k, n = g / (TH * TW), ty = (g / TW) % TH, tx = g % TW;
      input_tile(X + (n * C / XB + cb / VPB) * H * W * XB + (cb % VPB) * VL, vb, ty * MT - PT,
                 tx * MT - PL);
    }
    BARRIER();
    split_range(ALPHA * ALPHA * G * NFB, tid, nth, &lo, &hi);
    for (long it = lo; it < hi; it++) {
      const long t = it / (G * NFB), g = (it / NFB) % G, fb = it % NFB;
      const float *ub = Ub + ((t * G + g) * NFB + fb) * CG * OCB;
      for (long r = 0; r < rows; r += NT)
        ukr(Vb + (t * CHUNK + r) * C + g * CG, ub,
            Mb + (t * CHUNK + r) * FP + g * FPG + fb * OCB);
    }
    BARRIER();
    split_range(count * CBY, tid, nth, &lo, &hi);
    for (long it = lo; it < hi; it++) {
      const long k = it / CBY, fo = it % CBY;
      const long g = t0 + k, n = g / (TH * TW), ty = (g / TW) % TH, tx = g % TW;
      const long column = (fo * VL) / FG * FPG + (fo * VL) % FG;
      output_tile(Mb + k * FP + column, Y, bias, add, n, fo, ty * MT, tx * MT);
    }
    BARRIER();
  }
}
"""


def generate_winograd(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    """The C translation unit of a winograd conv2d (validated by the caller)."""
    plan = winograd_plan(op, s)
    dims = op.dims_dict
    nchw = not channel_block(op.attr("layout"))
    off_m = _round_up(plan.v_floats, ALIGN_FLOATS)
    off_x = off_m + _round_up(plan.m_floats, ALIGN_FLOATS)
    off_u = off_x + _round_up(plan.xb_floats, ALIGN_FLOATS)
    constants: dict[str, int | str] = {
        **shape_constants(op), "VL": d.lanes, "XB": plan.block, "VPB": plan.block // d.lanes,
        "MT": plan.m, "ALPHA": plan.alpha,
        "TH": plan.tiles_h, "TW": plan.tiles_w, "TILES": plan.tiles, "CHUNK": plan.chunk,
        "NT": s.ow_block, "OCB": s.oc_block, "NFB": plan.nfb, "FPG": plan.fpg, "FP": plan.fp,
        "CBX": dims["C"] // d.lanes, "CBY": dims["F"] // d.lanes, "OFF_M": off_m,
        "OFF_X": off_x, "OFF_U": off_u, "WB_FLOATS": plan.u_floats, "NCHW_IN": int(nchw),
        # The input copy (reorder's kernel) names the block and the block count its own way.
        "XD": plan.block, "CBD": dims["C"] // plan.block}
    out = [preamble(d, constants, s.threads), *filter(None, [scalar_helpers(op.epilogue)]),
           _pack_weights(transforms(plan.m)[1]),
           blocked_copy("to_blocked") if nchw else "", _input_tile(plan.m, plan.alpha),
           _output_tile(op, plan.m, plan.alpha, nchw),
           _gemm_ukr(s.ow_block, s.oc_block // d.lanes, d.lanes), _BODY]
    ws = f"{off_u + _round_up(plan.u_floats, ALIGN_FLOATS)}L"
    # The packed entry needs no room for U: a 512-channel layer's U is 38 MB.
    out.append(conv2d_entries(op, s.threads, ws, prepack=True, items="FP",
                              packed_ws_floats=f"{off_u}L"))
    return "\n".join(out)

