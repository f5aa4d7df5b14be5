"""C code for conv2d: blocked direct convolution and implicit GEMM, both with fused epilogues.

Same ABI as every kernel (``tc_kernel(void **args)`` / ``tc_time``), arguments in
:meth:`OpSignature.arguments` order (``X, W[, bias][, add], Y``), shapes as compile-time
constants. Layout conversions happen inside the kernel, so they are part of its measured time.

``direct`` (NCHW[x]c): the input is copied once per call into a zero-padded, channel-blocked
layout ``Xb[N][G][C/icb][Hp][Wp][icb]`` (padding done here, so the inner loops have no bounds
checks) and the weights into ``Wb[G][F/ocb][C/icb][R][S][icb][ocb]`` (zero-padded to whole
blocks). A register tile holds ``oh x ow`` output pixels x ``ocb`` output channels (vectors);
for every (channel block, r, s, c) it loads ``ocb/lanes`` weight vectors and broadcasts one
input scalar per pixel — GEMM's outer product with pixels as rows. The whole reduction stays
in registers; the finished tile goes through a small buffer to the NCHW output with bias,
residual add and relu applied. Depthwise convolutions (one channel per group) vectorise over
channels instead: ``Xb[N][C/ocb][Hp][Wp][ocb]``, one weight vector per tap, one input vector
per pixel.

``gemm`` (implicit GEMM): per group, ``Y[F,P*Q] = W[F,C*R*S] @ im2col(X)``. The weights are
packed into ``oc_block``-row panels (the A operand, broadcast), the im2col matrix is never
materialised: each thread packs a ``ic_block*R*S x ow_block`` panel of it on the fly (the B
operand, loaded as vectors along output pixels), and the micro-kernel writes NCHW output rows
directly. Partial tiles go through a local tile merged by scalar code, as in matmul.
"""

from __future__ import annotations

from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.codegen.matmul import _TIMER, _TIMER_PACKED, _WORKSPACE
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Conv2dSchedule, is_depthwise, plane_buffer_floats

ALIGN_FLOATS = 16  # 64 bytes


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _cdiv(x: int, m: int) -> int:
    return (x + m - 1) // m


_HEADER = """\
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#define MIN(x, y) ((x) < (y) ? (x) : (y))
"""



def _constants(op: OpSignature) -> str:
    d = op.dims_dict
    values = {
        "NB": d["N"], "C": d["C"], "H": d["H"], "W": d["W"], "F": d["F"], "R": d["R"],
        "S": d["S"], "SH": d["stride_h"], "SW": d["stride_w"], "PT": d["pad_t"],
        "PL": d["pad_l"], "DH": d["dil_h"], "DW": d["dil_w"], "G": d["groups"],
        "CG": d["C"] // d["groups"], "FG": d["F"] // d["groups"], "P": op.out_h,
        "Q": op.out_w, "HP": d["H"] + d["pad_t"] + d["pad_b"],
        "WP": d["W"] + d["pad_l"] + d["pad_r"],
    }
    return "".join(f"#define {k} {v}L\n" for k, v in values.items())


def _args(op: OpSignature) -> str:
    """Unpack ``args`` into X, Wt, bias, add, Y (absent epilogue tensors are NULL)."""
    names = [a.name for a in op.arguments()]
    bias = f"(const float *)args[{names.index('bias')}]" if "bias" in names else "NULL"
    add = f"(const float *)args[{names.index('add')}]" if "add" in names else "NULL"
    return (
        "  const float *X = (const float *)args[0], *Wt = (const float *)args[1];\n"
        f"  const float *bias = {bias}, *add = {add};\n"
        f"  float *Y = (float *)args[{len(names) - 1}];\n"
        "  (void)bias; (void)add;\n"
    )


def _epilogue_scalar(op: OpSignature, v: str, f: str, off: str) -> str:
    """C statements applying the epilogue to float ``v`` of channel ``f`` at output ``off``."""
    out = []
    if "bias" in op.epilogue:
        out.append(f"{v} += bias[{f}];")
    if "add" in op.epilogue:
        out.append(f"{v} += add[{off}];")
    if "relu" in op.epilogue:
        out.append(f"if ({v} < 0.0f) {v} = 0.0f;")
    return " ".join(out)


def _parallel_entry(threads: int, body_call: str, ws_floats: str) -> str:
    if threads == 1:
        return (
            f"  float *ws = tc_workspace({ws_floats});\n  if (!ws) return 1;\n"
            f"  {body_call.replace('TID', '0').replace('NTH', '1')}\n  return 0;\n}}\n"
        )
    return (
        f"  float *ws = tc_workspace({ws_floats});\n  if (!ws) return 1;\n"
        f"#pragma omp parallel num_threads({threads})\n  {{\n"
        "    int tid = omp_get_thread_num(), nth = omp_get_num_threads();\n"
        f"    {body_call.replace('TID', 'tid').replace('NTH', 'nth')}\n  }}\n  return 0;\n}}\n"
    )


def _entries(op: OpSignature, threads: int, ws_floats: str, prepack: bool) -> str:
    """``tc_kernel`` and ``tc_time``; with ``prepack``, also the pre-packed-weights ABI.

    ``tc_pack_weights(W, Wb)`` writes W (F x C/g x R x S) into the blocked layout the kernel
    reads (``tc_packed_weights_floats()`` floats, 64-byte aligned); ``tc_kernel_packed``
    takes the same arguments as ``tc_kernel`` with that buffer in W's place and skips the
    per-call repacking. Constant weights are packed once, when a model is compiled.
    """
    def entry(name: str, packed: int) -> str:
        return (f"int {name}(void **args) {{\n" + _args(op) + _parallel_entry(
            threads, f"conv_body(X, Wt, bias, add, Y, ws, TID, NTH, {packed});", ws_floats))

    out = [entry("tc_kernel", 0), _TIMER]
    if prepack:
        out += [entry("tc_kernel_packed", 1),
                "long tc_packed_weights_floats(void) { return WB_FLOATS; }\n",
                "void tc_pack_weights(const float *Wt, float *Wb) {\n"
                "  pack_weights(Wt, Wb, 0, WPACK_ITEMS);\n}\n", _TIMER_PACKED]
    return "\n".join(out)


def generate_conv2d(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    """The C translation unit for the conv2d ``op`` under ``s`` (validated by the caller)."""
    if s.algorithm == "gemm":
        return _generate_gemm(op, s, d)
    if not s.pack_w:
        return _generate_plane(op, s, d)
    return _generate_direct(op, s, d)


# -- depthwise plane kernel -------------------------------------------------------------------


def _plane_tile(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    """One TH x QV output tile of one channel: accumulators over R x S taps, then the
    epilogue, stored straight into NCHW rows (full tiles) or through a scratch tile."""
    th, nv, lanes = s.oh_block, s.ow_block // d.lanes, d.lanes
    acc = [(i, v) for i in range(th) for v in range(nv)]
    lines = ["static inline void plane_tile(const float *restrict buf, const float *restrict w,",
             "                              float *restrict y, const float *restrict addp,",
             "                              float bias_c, long p0, long q0, long th, long tw) {",
             "  (void)addp; (void)bias_c;",
             "  vec " + ", ".join(f"a{i}_{v} = VZERO()" for i, v in acc) + ";",
             "  for (long r = 0; r < R; r++) {"]
    if s.unroll_kw:
        lines.append("#pragma GCC unroll 16")
    lines += ["    for (long s = 0; s < S; s++) {",
              "      const vec wv = VSET1(w[r * S + s]);",
              "      const float *base = buf + ((s * DW) % SW) * PLANE + (p0 * SH + r * DH) * PW"
              " + q0 + (s * DW) / SW;"]
    for i, v in acc:
        lines.append(f"      a{i}_{v} = VFMA(VLOADU(base + {i} * SH * PW + {v * lanes}), wv, "
                     f"a{i}_{v});")
    lines += ["    }", "  }", "  if (th == TH && tw == QV) {"]
    for i, v in acc:
        off = f"(p0 + {i}) * Q + q0 + {v * lanes}"
        steps = [f"vec o = a{i}_{v};"]
        if "bias" in op.epilogue:
            steps.append("o = VADD(o, VSET1(bias_c));")
        if "add" in op.epilogue:
            steps.append(f"o = VADD(o, VLOADU(addp + {off}));")
        if "relu" in op.epilogue:
            steps.append("o = VRELU(o);")
        steps.append(f"VSTOREU(y + {off}, o);")
        lines.append("    { " + " ".join(steps) + " }")
    lines += ["    return;", "  }", "  float tile[TH * QV];"]
    for i, v in acc:
        lines.append(f"  VSTOREU(tile + {i * s.ow_block + v * lanes}, a{i}_{v});")
    epi = []
    if "bias" in op.epilogue:
        epi.append("v += bias_c;")
    if "add" in op.epilogue:
        epi.append("v += addp[(p0 + i) * Q + q0 + j];")
    if "relu" in op.epilogue:
        epi.append("if (v < 0.0f) v = 0.0f;")
    lines += ["  for (long i = 0; i < th; i++)",
              "    for (long j = 0; j < tw; j++) {",
              "      float v = tile[i * QV + j];",
              "      " + " ".join(epi),
              "      y[(p0 + i) * Q + q0 + j] = v;",
              "    }",
              "}"]
    return "\n".join(lines)


def _generate_plane(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    """Depthwise conv2d straight from NCHW: per channel, the zero-padded input plane split
    into ``stride_w`` column phases (phase k holds padded columns k, k+SW, ...) in a
    per-thread buffer, so every tap of a tile is a unit-stride vector load; output columns
    fill the lanes. No layout conversion of input, weights or output."""
    rows, width, floats = plane_buffer_floats(op, s)
    buf_floats = _round_up(floats, ALIGN_FLOATS)
    out = [d.prelude, _HEADER, _constants(op)]
    out.append(
        f"#define TH {s.oh_block}L\n#define QV {s.ow_block}L\n#define PW {width}L\n"
        f"#define PLANE ({rows}L * PW)\n#define BUF_FLOATS {buf_floats}L\n"
        f"#define NPB {_cdiv(op.out_h, s.oh_block)}L\n#define NQT {_cdiv(op.out_w, s.ow_block)}L\n"
    )
    out.append(_WORKSPACE)
    out.append("""\
/* Channel plane x (H x W) into buf: phase (PL + iw) % SW, row PT + ih, column (PL + iw) / SW.
 * Only interior positions are written: the zero padding, set once per call, stays. */
static void fill_plane(const float *restrict x, float *restrict buf) {
  for (long ih = 0; ih < H; ih++) {
    const float *restrict src = x + ih * W;
    float *restrict row = buf + (PT + ih) * PW;
    if (SW == 1) {
      memcpy(row + PL, src, sizeof(float) * W);
    } else {
      for (long k = 0; k < SW; k++) {
        /* padded columns wp = PL + iw with wp % SW == k, in order: a strided read and a
         * unit-stride write, no division per element */
        const long iw0 = ((k - PL) % SW + SW) % SW;
        float *restrict dst = row + k * PLANE + (PL + iw0) / SW;
        for (long iw = iw0, j = 0; iw < W; iw += SW, j++) dst[j] = src[iw];
      }
    }
  }
}
""")
    out.append(_plane_tile(op, s, d))
    out.append("""
static void conv_body(const float *restrict X, const float *restrict Wt,
                      const float *restrict bias, const float *restrict add, float *restrict Y,
                      float *ws, int tid, int nth, int packed) {
  (void)packed; (void)bias; (void)add;
  float *buf = ws + tid * BUF_FLOATS;
  memset(buf, 0, sizeof(float) * BUF_FLOATS);
  long lo, hi;
  split_range(NB * C, tid, nth, &lo, &hi);
  for (long t = lo; t < hi; t++) {
    const long c = t % C;
    fill_plane(X + t * H * W, buf);
    const float *w = Wt + c * R * S;
    float *y = Y + t * P * Q;
    const float *addp = add ? add + t * P * Q : NULL;
    const float bias_c = bias ? bias[c] : 0.0f;
    for (long pb = 0; pb < NPB; pb++) {
      const long p0 = pb * TH, th = MIN(TH, P - p0);
      for (long qt = 0; qt < NQT; qt++) {
        const long q0 = qt * QV, tw = MIN(QV, Q - q0);
        plane_tile(buf, w, y, addp, bias_c, p0, q0, th, tw);
      }
    }
  }
}
""")
    out.append(_entries(op, s.threads, f"{s.threads}L * BUF_FLOATS", prepack=False))
    return "\n".join(out)


# -- direct ---------------------------------------------------------------------------------


def _direct_ukr(name: str, th: int, tw: int, s: Conv2dSchedule, d: IsaDialect,
                depthwise: bool) -> str:
    """A register tile of ``th`` x ``tw`` pixels x OCB channels over the whole reduction."""
    nv = s.oc_block // d.lanes
    lanes = d.lanes
    lines = [f"static inline void {name}(const float *restrict xb, const float *restrict wb, "
             "float *restrict tile) {"]
    for i in range(th):
        for j in range(tw):
            lines.append("  vec " + ", ".join(f"a{i}_{j}_{v} = VZERO()" for v in range(nv)) + ";")
    unroll = "#pragma GCC unroll 16\n" if s.unroll_kw else ""
    if depthwise:
        lines.append("  for (long r = 0; r < R; r++) {")
        lines.append(f"{unroll}    for (long s = 0; s < S; s++) {{")
        lines.append("      const float *xr = xb + (r * DH * WP + s * DW) * OCB;")
        lines.append("      const float *wr = wb + (r * S + s) * OCB;")
        lines.append("      vec " + ", ".join(f"w{v} = VLOAD(wr + {v * lanes})" for v in range(nv))
                     + ";")
        for i in range(th):
            for j in range(tw):
                off = f"({i} * SH * WP + {j} * SW) * OCB"
                lines.append("      " + " ".join(
                    f"a{i}_{j}_{v} = VFMA(VLOAD(xr + {off} + {v * lanes}), w{v}, a{i}_{j}_{v});"
                    for v in range(nv)))
        lines.append("    }\n  }")
    else:
        lines.append("  for (long cb = 0; cb < NCB; cb++) {")
        lines.append("    const float *xc = xb + cb * (HP * WP * ICB);")
        lines.append("    const float *wc = wb + cb * (R * S * ICB * OCB);")
        lines.append("    for (long r = 0; r < R; r++) {")
        lines.append(f"{unroll}      for (long s = 0; s < S; s++) {{")
        lines.append("        const float *xr = xc + (r * DH * WP + s * DW) * ICB;")
        lines.append("        const float *wr = wc + (r * S + s) * (ICB * OCB);")
        lines.append("        for (long c = 0; c < ICB; c++) {")
        lines.append("          vec " + ", ".join(
            f"w{v} = VLOAD(wr + c * OCB + {v * lanes})" for v in range(nv)) + ";")
        for i in range(th):
            for j in range(tw):
                fmas = " ".join(f"a{i}_{j}_{v} = VFMA(x, w{v}, a{i}_{j}_{v});" for v in range(nv))
                lines.append(f"          {{ vec x = VSET1(xr[({i} * SH * WP + {j} * SW) * ICB + c]);"
                             f" {fmas} }}")
        lines.append("        }\n      }\n    }\n  }")
    for i in range(th):
        for j in range(tw):
            for v in range(nv):
                lines.append(f"  VSTORE(tile + ({i} * TW + {j}) * OCB + {v * lanes}, a{i}_{j}_{v});")
    lines.append("}")
    return "\n".join(lines)


def _generate_direct(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    dims = op.dims_dict
    depthwise = is_depthwise(op)
    cg = dims["C"] // dims["groups"]
    fg = dims["F"] // dims["groups"]
    P, Q = op.out_h, op.out_w
    tw = min(s.ow_block, Q)
    th = min(s.oh_block, P)
    icb = 1 if depthwise else min(s.ic_block, cg)
    ncb = _cdiv(dims["C"], s.oc_block) if depthwise else _cdiv(cg, icb)
    nfb = _cdiv(fg, s.oc_block)
    hp = dims["H"] + dims["pad_t"] + dims["pad_b"]
    wp = dims["W"] + dims["pad_l"] + dims["pad_r"]
    if depthwise:
        xb_floats = dims["N"] * ncb * hp * wp * s.oc_block
        wb_floats = ncb * dims["R"] * dims["S"] * s.oc_block
        ngf = ncb  # channel blocks
    else:
        xb_floats = dims["N"] * dims["groups"] * ncb * hp * wp * icb
        wb_floats = dims["groups"] * nfb * ncb * dims["R"] * dims["S"] * icb * s.oc_block
        ngf = dims["groups"] * nfb
    off_wb = _round_up(xb_floats, ALIGN_FLOATS)
    ws_floats = off_wb + _round_up(wb_floats, ALIGN_FLOATS)
    npb = _cdiv(P, th)
    nqt = _cdiv(Q, tw)
    th_tail, tw_tail = P - (npb - 1) * th, Q - (nqt - 1) * tw

    out = [d.prelude, _HEADER, _constants(op)]
    out.append(
        f"#define OCB {s.oc_block}L\n#define ICB {icb}L\n#define NCB {ncb}L\n#define NFB {nfb}L\n"
        f"#define TH {th}L\n#define TW {tw}L\n#define NGF {ngf}L\n#define NPB {npb}L\n"
        f"#define NQT {nqt}L\n#define OFF_WB {off_wb}L\n#define WB_FLOATS {wb_floats}L\n"
    )
    out.append("#define BARRIER() _Pragma(\"omp barrier\")" if s.threads > 1
               else "#define BARRIER() ((void)0)")
    out.append(_WORKSPACE)
    if depthwise:
        out.append("""\
/* Xb[n][cb][hp][wp][OCB]: zero-padded, channels blocked across groups. Items: (n, cb, hp). */
static void pack_input(const float *restrict X, float *restrict Xb, long lo, long hi) {
  for (long t = lo; t < hi; t++) {
    const long hp = t % HP, cb = (t / HP) % NCB, n = t / (HP * NCB);
    float *restrict dst = Xb + t * (WP * OCB);
    const long ih = hp - PT;
    if (ih < 0 || ih >= H) { memset(dst, 0, sizeof(float) * WP * OCB); continue; }
    memset(dst, 0, sizeof(float) * PL * OCB);
    memset(dst + (PL + W) * OCB, 0, sizeof(float) * (WP - PL - W) * OCB);
    for (long o = 0; o < OCB; o++) {
      const long c = cb * OCB + o;
      if (c >= C) { for (long iw = 0; iw < W; iw++) dst[(PL + iw) * OCB + o] = 0.0f; continue; }
      const float *restrict src = X + ((n * C + c) * H + ih) * W;
      for (long iw = 0; iw < W; iw++) dst[(PL + iw) * OCB + o] = src[iw];
    }
  }
}

/* Wb[cb][r][s][OCB]. Items: cb. */
static void pack_weights(const float *restrict Wt, float *restrict Wb, long lo, long hi) {
  for (long cb = lo; cb < hi; cb++)
    for (long rs = 0; rs < R * S; rs++)
      for (long o = 0; o < OCB; o++) {
        const long c = cb * OCB + o;
        Wb[(cb * R * S + rs) * OCB + o] = c < C ? Wt[c * R * S + rs] : 0.0f;
      }
}
#define PACK_ITEMS (NB * NCB * HP)
#define WPACK_ITEMS NCB
""")
    else:
        out.append("""\
/* Xb[n][g][cb][hp][wp][ICB]: zero-padded, channel-blocked. Items: (n, g, cb, hp). */
static void pack_input(const float *restrict X, float *restrict Xb, long lo, long hi) {
  for (long t = lo; t < hi; t++) {
    const long hp = t % HP, cb = (t / HP) % NCB, g = (t / (HP * NCB)) % G;
    const long n = t / (HP * NCB * G);
    float *restrict dst = Xb + t * (WP * ICB);
    const long ih = hp - PT;
    if (ih < 0 || ih >= H) { memset(dst, 0, sizeof(float) * WP * ICB); continue; }
    memset(dst, 0, sizeof(float) * PL * ICB);
    memset(dst + (PL + W) * ICB, 0, sizeof(float) * (WP - PL - W) * ICB);
    for (long c = 0; c < ICB; c++) {
      const long ci = cb * ICB + c;
      if (ci >= CG) { for (long iw = 0; iw < W; iw++) dst[(PL + iw) * ICB + c] = 0.0f; continue; }
      const float *restrict src = X + ((n * C + g * CG + ci) * H + ih) * W;
      for (long iw = 0; iw < W; iw++) dst[(PL + iw) * ICB + c] = src[iw];
    }
  }
}

/* Wb[g][fb][cb][r][s][ICB][OCB]. Items: (g, fb). */
static void pack_weights(const float *restrict Wt, float *restrict Wb, long lo, long hi) {
  for (long t = lo; t < hi; t++) {
    const long g = t / NFB, fb = t % NFB;
    float *restrict dst = Wb + t * (NCB * R * S * ICB * OCB);
    /* Write OCB-long runs; the OCB source rows read per step stay in L1 across (c, rs). */
    const long fvalid = MIN(OCB, FG - fb * OCB);
    for (long cb = 0; cb < NCB; cb++)
      for (long c = 0; c < ICB; c++) {
        const long ci = cb * ICB + c;
        for (long rs = 0; rs < R * S; rs++) {
          float *restrict d = dst + ((cb * R * S + rs) * ICB + c) * OCB;
          const float *restrict src = Wt + ((g * FG + fb * OCB) * CG + ci) * R * S + rs;
          long o = 0;
          if (ci < CG)
            for (; o < fvalid; o++) d[o] = src[o * CG * R * S];
          for (; o < OCB; o++) d[o] = 0.0f;
        }
      }
  }
}
#define PACK_ITEMS (NB * G * NCB * HP)
#define WPACK_ITEMS (G * NFB)
""")
    variants = {(th, tw): "ukr_full"}
    variants.setdefault((th, tw_tail), "ukr_qtail")
    variants.setdefault((th_tail, tw), "ukr_ptail")
    variants.setdefault((th_tail, tw_tail), "ukr_corner")
    for (vh, vw), name in variants.items():
        out.append(_direct_ukr(name, vh, vw, s, d, depthwise))
    # Output channel f0 + o, o < fvalid, of the th x tw tile at (p0, q0) of image n.
    epi = _epilogue_scalar(op, "v", "f", "o_off + j")
    out.append(f"""\
static void store_tile(const float *restrict tile, float *restrict Y, const float *restrict bias,
                       const float *restrict add, long n, long f0, long fvalid, long p0, long q0,
                       long th, long tw) {{
  (void)bias; (void)add;
  for (long o = 0; o < fvalid; o++) {{
    const long f = f0 + o;
    for (long i = 0; i < th; i++) {{
      const long o_off = ((n * F + f) * P + p0 + i) * Q + q0;
      float *restrict y = Y + o_off;
      for (long j = 0; j < tw; j++) {{
        float v = tile[(i * TW + j) * OCB + o];
        {epi}
        y[j] = v;
      }}
    }}
  }}
}}
""")
    if depthwise:
        x_at = "Xb + ((n * NCB + gf) * HP + p0 * SH) * WP * OCB + q0 * SW * OCB"
        w_at = "Wb + gf * (R * S * OCB)"
        f0, fvalid = "gf * OCB", "MIN(OCB, C - gf * OCB)"
    else:
        x_at = ("Xb + (((n * G + gf / NFB) * NCB) * HP + p0 * SH) * WP * ICB + q0 * SW * ICB")
        w_at = "Wb + gf * (NCB * R * S * ICB * OCB)"
        f0, fvalid = "(gf / NFB) * FG + (gf % NFB) * OCB", "MIN(OCB, FG - (gf % NFB) * OCB)"
    calls = []
    for (vh, vw), name in variants.items():
        calls.append(f"if (th == {vh} && tw == {vw}) {name}(xb, wb, tile);")
    dispatch = "\n          else ".join(calls)
    tile_floats = th * tw * s.oc_block
    split_oc = s.parallel == "oc"
    oc_range = ("long gf_lo, gf_hi; split_range(NGF, tid, nth, &gf_lo, &gf_hi);" if split_oc
                else "const long gf_lo = 0, gf_hi = NGF;")
    pb_range = ("const long pb_lo = 0, pb_hi = NPB;" if split_oc
                else "long pb_lo, pb_hi; split_range(NPB, tid, nth, &pb_lo, &pb_hi);")
    if s.loop_order == "fp":
        loops = ("for (long gf = gf_lo; gf < gf_hi; gf++)\n"
                 "      for (long pb = pb_lo; pb < pb_hi; pb++) {")
    else:
        loops = ("for (long pb = pb_lo; pb < pb_hi; pb++)\n"
                 "      for (long gf = gf_lo; gf < gf_hi; gf++) {")
    out.append(f"""\
static void conv_body(const float *restrict X, const float *restrict Wt,
                      const float *restrict bias, const float *restrict add, float *restrict Y,
                      float *ws, int tid, int nth, int packed) {{
  float *Xb = ws, *Wb_ws = ws + OFF_WB;
  const float *Wb = packed ? Wt : Wb_ws;
  float tile[{tile_floats}] __attribute__((aligned(64)));
  {{ long lo, hi; split_range(PACK_ITEMS, tid, nth, &lo, &hi); pack_input(X, Xb, lo, hi); }}
  if (!packed) {{
    long lo, hi; split_range(WPACK_ITEMS, tid, nth, &lo, &hi); pack_weights(Wt, Wb_ws, lo, hi);
  }}
  BARRIER();
  {oc_range}
  {pb_range}
  for (long n = 0; n < NB; n++)
    {loops}
      const long p0 = pb * TH, th = MIN(TH, P - p0);
      for (long qt = 0; qt < NQT; qt++) {{
        const long q0 = qt * TW, tw = MIN(TW, Q - q0);
        const float *xb = {x_at};
        const float *wb = {w_at};
        {dispatch}
        store_tile(tile, Y, bias, add, n, {f0}, {fvalid}, p0, q0, th, tw);
      }}
    }}
}}
""")
    out.append(_entries(op, s.threads, f"{ws_floats}L", prepack=True))
    return "\n".join(out)


# -- gemm (implicit GEMM) -----------------------------------------------------------------------


def _gemm_ukr(name: str, s: Conv2dSchedule, d: IsaDialect, has_bias: bool, has_add: bool,
              has_relu: bool, a_ps: str = "MR", a_rs: str = "1") -> str:
    """MR rows (weights, broadcast) x NR pixels (vectors); C rows are ``ldc`` apart.

    Weight (row r, reduction step p) is ``a[p*a_ps + r*a_rs]``.
    """
    mr, nv, lanes = s.oc_block, s.ow_block // d.lanes, d.lanes
    lines = [
        f"static inline void {name}(long kc, const float *restrict a, const float *restrict b, "
        "float *restrict c, long ldc, int first, int last, const float *restrict bias, "
        "const float *restrict add) {",
        "  (void)bias; (void)add;",
    ]
    for r in range(mr):
        lines.append("  vec " + ", ".join(f"c{r}_{v} = VZERO()" for v in range(nv)) + ";")
    lines.append("  for (long p = 0; p < kc; p++) {")
    lines.append("    vec " + ", ".join(f"b{v} = VLOAD(b + p * NR + {v * lanes})"
                                        for v in range(nv)) + ";")
    for r in range(mr):
        fmas = " ".join(f"c{r}_{v} = VFMA(a{r}, b{v}, c{r}_{v});" for v in range(nv))
        lines.append(f"    {{ vec a{r} = VSET1(a[p * ({a_ps}) + {r} * ({a_rs})]); {fmas} }}")
    lines.append("  }")
    for r in range(mr):
        for v in range(nv):
            ptr = f"c + {r} * ldc + {v * lanes}"
            step = f"  {{ vec t = c{r}_{v}; if (!first) t = VADD(t, VLOADU({ptr}));"
            if has_bias or has_add or has_relu:
                step += " if (last) {"
                if has_bias:
                    step += f" t = VADD(t, VSET1(bias[{r}]));"
                if has_add:
                    step += f" t = VADD(t, VLOADU(add + {r} * ldc + {v * lanes}));"
                if has_relu:
                    step += " t = VRELU(t);"
                step += " }"
            step += f" VSTOREU({ptr}, t); }}"
            lines.append(step)
    lines.append("}")
    return "\n".join(lines)


def _generate_gemm(op: OpSignature, s: Conv2dSchedule, d: IsaDialect) -> str:
    dims = op.dims_dict
    cg = dims["C"] // dims["groups"]
    fg = dims["F"] // dims["groups"]
    R, S = dims["R"], dims["S"]
    k_total = cg * R * S
    kc = min(s.ic_block, cg) * R * S
    mr, nr = s.oc_block, s.ow_block
    nfp = _cdiv(fg, mr)
    pq = op.out_h * op.out_w
    npp = _cdiv(pq, nr)
    tail = fg % mr != 0
    ap_floats = dims["groups"] * (nfp if s.pack_w else int(tail)) * k_total * mr
    bp_floats = _round_up(kc * nr, ALIGN_FLOATS)
    off_bp = _round_up(ap_floats, ALIGN_FLOATS)
    has_bias, has_add, has_relu = ("bias" in op.epilogue, "add" in op.epilogue,
                                   "relu" in op.epilogue)
    plain = (R == 1 and S == 1 and dims["stride_h"] == 1 and dims["stride_w"] == 1
             and dims["pad_t"] == 0 and dims["pad_l"] == 0 and dims["pad_b"] == 0
             and dims["pad_r"] == 0)
    out = [d.prelude, _HEADER, _constants(op)]
    out.append(
        f"#define MR {mr}L\n#define NR {nr}L\n#define KTOT {k_total}L\n#define KC {kc}L\n"
        f"#define NFP {nfp}L\n#define PQ {pq}L\n#define NPP {npp}L\n#define OFF_BP {off_bp}L\n"
        f"#define BP_FLOATS {bp_floats}L\n#define PACK_W {s.pack_w}\n"
        f"#define WB_FLOATS {ap_floats}L\n"
        f"#define WPACK_ITEMS {dims['groups'] * nfp if s.pack_w else dims['groups'] * int(tail)}L\n"
    )
    out.append("#define BARRIER() _Pragma(\"omp barrier\")" if s.threads > 1
               else "#define BARRIER() ((void)0)")
    out.append(_WORKSPACE)
    out.append("""\
/* Ap[g][fp][k][MR], k = (c, r, s) as in W's memory order, zero-padded rows. Items: (g, fp);
 * with pack_w=0 only the last (partial) panel of each group is packed, at Ap[g]. */
static void pack_weights(const float *restrict Wt, float *restrict Ap, long lo, long hi) {
  for (long t = lo; t < hi; t++) {
    const long g = PACK_W ? t / NFP : t, fp = PACK_W ? t % NFP : NFP - 1;
    float *restrict dst = Ap + t * (KTOT * MR);
    const long mvalid = MIN(MR, FG - fp * MR);
    const float *restrict src = Wt + (g * FG + fp * MR) * KTOT;
    for (long k = 0; k < KTOT; k++) {
      long r = 0;
      for (; r < mvalid; r++) dst[k * MR + r] = src[r * KTOT + k];
      for (; r < MR; r++) dst[k * MR + r] = 0.0f;
    }
  }
}
""")
    if plain:
        pack_b = """\
/* One im2col panel: rows k0..k0+kcur of pixels j0..j0+NR of image n, group g. 1x1 stride 1
 * without padding: the panel is a plain copy of NCHW rows. */
static void pack_panel(float *restrict dst, const float *restrict X, long n, long g, long k0,
                       long kcur, long j0) {
  const long nval = MIN(NR, PQ - j0);
  for (long k = 0; k < kcur; k++) {
    const float *restrict src = X + (n * C + g * CG + k0 + k) * PQ + j0;
    long j = 0;
    for (; j < nval; j++) dst[k * NR + j] = src[j];
    for (; j < NR; j++) dst[k * NR + j] = 0.0f;
  }
}
"""
    else:
        pack_b = """\
/* One im2col panel: rows k0..k0+kcur (k = (c, r, s)) of pixels j0..j0+NR of image n, group g,
 * zero outside the input (padding) and beyond the last pixel. */
static void pack_panel(float *restrict dst, const float *restrict X, long n, long g, long k0,
                       long kcur, long j0) {
  long ihb[NR], iwb[NR];
  for (long j = 0; j < NR; j++) {
    const long pix = j0 + j;
    ihb[j] = pix < PQ ? (pix / Q) * SH - PT : -(1L << 40);
    iwb[j] = pix < PQ ? (pix % Q) * SW - PL : 0;
  }
  for (long k = 0; k < kcur; k++) {
    const long kk = k0 + k, c = kk / (R * S), r = (kk / S) % R, s = kk % S;
    const float *restrict src = X + (n * C + g * CG + c) * H * W;
    for (long j = 0; j < NR; j++) {
      const long ih = ihb[j] + r * DH, iw = iwb[j] + s * DW;
      dst[k * NR + j] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? src[ih * W + iw] : 0.0f;
    }
  }
}
"""
    out.append(pack_b)
    out.append(_gemm_ukr("ukr", s, d, has_bias, has_add, has_relu))
    if not s.pack_w:
        out.append(_gemm_ukr("ukr_d", s, d, has_bias, has_add, has_relu, "1", "KTOT"))
    epi = _epilogue_scalar(op, "v", "f", "off")
    out.append(f"""\
static void merge_tile(float *restrict Y, const float *restrict ct, const float *restrict bias,
                       const float *restrict add, long n, long f0, long m_cur, long j0,
                       long n_cur, int first, int last) {{
  (void)bias; (void)add;
  for (long r = 0; r < m_cur; r++) {{
    const long f = f0 + r;
    for (long j = 0; j < n_cur; j++) {{
      const long off = (n * F + f) * PQ + j0 + j;
      float v = ct[r * NR + j];
      if (!first) v += Y[off];
      if (last) {{ {epi} }}
      Y[off] = v;
    }}
  }}
}}
""")
    if s.parallel == "pixel":
        ranges = ("long pp_lo, pp_hi; split_range(NB * G * NPP, tid, nth, &pp_lo, &pp_hi);\n"
                  "  const long fp_lo = 0, fp_hi = NFP;")
    else:
        ranges = ("const long pp_lo = 0, pp_hi = NB * G * NPP;\n"
                  "  long fp_lo, fp_hi; split_range(NFP, tid, nth, &fp_lo, &fp_hi);")
    bias_row = "bias + f0" if has_bias else "NULL"
    add_row = "add + (n * F + f0) * PQ + j0" if has_add else "NULL"
    y_at = "Y + (n * F + f0) * PQ + j0"
    if s.pack_w:
        block = f"""const float *a = Ap + (g * NFP + fp) * (KTOT * MR) + pc * MR;
        if (m_cur == MR && n_cur == NR) {{
          ukr(k_cur, a, Bp, {y_at}, PQ, first, last, {bias_row}, {add_row});
        }} else {{
          ukr(k_cur, a, Bp, ct, NR, 1, 0, NULL, NULL);
          merge_tile(Y, ct, bias, add, n, f0, m_cur, j0, n_cur, first, last);
        }}"""
    else:
        block = f"""if (m_cur == MR) {{
          const float *a = Wt + f0 * KTOT + pc;
          if (n_cur == NR) ukr_d(k_cur, a, Bp, {y_at}, PQ, first, last, {bias_row}, {add_row});
          else {{
            ukr_d(k_cur, a, Bp, ct, NR, 1, 0, NULL, NULL);
            merge_tile(Y, ct, bias, add, n, f0, m_cur, j0, n_cur, first, last);
          }}
        }} else {{
          ukr(k_cur, Ap + g * (KTOT * MR) + pc * MR, Bp, ct, NR, 1, 0, NULL, NULL);
          merge_tile(Y, ct, bias, add, n, f0, m_cur, j0, n_cur, first, last);
        }}"""
    out.append(f"""\
static void conv_body(const float *restrict X, const float *restrict Wt,
                      const float *restrict bias, const float *restrict add, float *restrict Y,
                      float *ws, int tid, int nth, int packed) {{
  /* packed: Wt already holds the Ap panels (pack_w=1 only, see tc_pack_weights) */
  const float *Ap = packed ? Wt : ws;
  float *Bp = ws + OFF_BP + tid * BP_FLOATS;
  float ct[MR * NR] __attribute__((aligned(64)));
  if (!packed) {{
    long lo, hi; split_range(WPACK_ITEMS, tid, nth, &lo, &hi); pack_weights(Wt, ws, lo, hi);
  }}
  BARRIER();
  {ranges}
  if (fp_lo >= fp_hi) return;
  for (long t = pp_lo; t < pp_hi; t++) {{
    const long pp = t % NPP, g = (t / NPP) % G, n = t / (NPP * G);
    const long j0 = pp * NR, n_cur = MIN(NR, PQ - j0);
    for (long pc = 0; pc < KTOT; pc += KC) {{
      const long k_cur = MIN(KC, KTOT - pc);
      const int first = pc == 0, last = pc + KC >= KTOT;
      pack_panel(Bp, X, n, g, pc, k_cur, j0);
      for (long fp = fp_lo; fp < fp_hi; fp++) {{
        const long f0 = g * FG + fp * MR, m_cur = MIN(MR, FG - fp * MR);
        {block}
      }}
    }}
  }}
}}
""")
    ws = f"OFF_BP + {s.threads}L * BP_FLOATS"
    out.append(_entries(op, s.threads, ws, prepack=bool(s.pack_w)))
    return "\n".join(out)
