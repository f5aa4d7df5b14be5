"""The ``pwdw`` kind: a pointwise (1x1) convolution whose output only a depthwise convolution
reads, fused so that the expanded tensor between them is never stored.

MobileNet-v2's inverted residual blocks expand the channels six-fold with a 1x1 conv, then
run a depthwise 3x3 over the expanded tensor: at 112x112 that tensor is 4.8 MB, written by
one kernel and read back by the next from beyond L2. Here each thread computes, for one
or two channel blocks at a time (``band_blocks``), the expanded rows a band of depthwise
row tiles reads (the 1x1 conv and its epilogue, straight into a band buffer with the
depthwise padding around it), then runs the depthwise tiles over the band. Consecutive
bands of the same channels share ``R - stride_h`` rows; those are moved, not recomputed, so
the 1x1 conv is computed once per expanded element.

``X[N,C,H,W]`` (``layout``: ``nchw`` or ``nchw{x}c``), ``W1[F,C,1,1]`` and, with ``bias`` in
``pw_epilogue``, ``b1[F]``, give ``E = pw_epilogue(conv1x1(X, W1) + b1)``; then ``W2[F,1,R,S]``
and, with ``bias`` in the epilogue, ``b2[F]`` give ``Y[N,F,P,Q] = epilogue(dwconv(E, W2) +
b2)`` (``out_layout``: blocked ``nchw{x}c``, F whole blocks). The depthwise parameters are
conv2d's (strides, asymmetric pads, dilations). :func:`pointwise_part` and
:func:`depthwise_part` are the two conv2d ops it replaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tunecache.compiler.codegen.abi import (
    ALIGN_FLOATS,
    PackedWeights,
    kernel_entries,
    preamble,
)
from tunecache.compiler.codegen.epilogue import reference as epilogue_reference
from tunecache.compiler.codegen.epilogue import scalar_helpers
from tunecache.compiler.codegen.isa import IsaDialect
from tunecache.compiler.codegen.microkernel import Loop, Store, Tile, micro_kernel
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import OpKind, register
from tunecache.compiler.kinds.conv2d import ACTIVATIONS, conv2d_nchw, conv2d_op, is_depthwise
from tunecache.compiler.kinds.conv2d import KIND as CONV2D
from tunecache.compiler.kinds.conv2d.common import shape_constants, y_storage
from tunecache.compiler.kinds.conv2d.emit import blocked_store, direct_ukr
from tunecache.compiler.kinds.conv2d.space import Conv2dSchedule
from tunecache.compiler.kinds.layouts import (
    BLOCKED,
    LAYOUTS,
    channel_block,
    from_layout,
    layout_problems,
    random_tensor,
    tensor_shape,
    to_layout,
    with_attrs,
)
from tunecache.compiler.kinds.matmul import epilogue_tuple
from tunecache.compiler.mathutil import round_up
from tunecache.compiler.ops import (
    KindSpec,
    OpSignature,
    TensorArg,
    kernel_extent_problems,
    window_params,
)
from tunecache.compiler.schedule import ScheduleData

__all__ = ["PwdwSchedule", "depthwise_part", "pointwise_part", "pwdw_op"]

PW_EPILOGUES = ("none", "bias", *ACTIVATIONS, *(f"bias+{a}" for a in ACTIVATIONS))
"""The pointwise half's epilogue: optional bias, then at most one activation."""

BAND_BUDGET_FLOATS = 16 * 1024
"""The default band: as many row tiles as fit 64 KiB (conv2d's depthwise band budget)."""

MAX_BAND_FLOATS = 256 * 1024
"""A band larger than 1 MiB per thread would leave L2 on every machine we target."""


def pwdw_op(N: int, C: int, H: int, W: int, F: int, R: int, S: int, *,
            stride: int | tuple[int, int] = 1, pads: int | tuple[int, int, int, int] = 0,
            dilation: int | tuple[int, int] = 1, pw_epilogue: str = "none",
            epilogue: tuple[str, ...] | str = (), dtype: str = "float32",
            layout: str = "nchw16c", out_layout: str = "nchw16c") -> OpSignature:
    """The fused op of ``conv2d(X, W1[F,C,1,1])`` then a depthwise ``R x S`` conv (``stride``,
    ``pads`` (top, left, bottom, right), ``dilation`` as in :func:`conv2d_op`)."""
    return OpSignature(
        KIND.name,
        (("N", N), ("C", C), ("H", H), ("W", W), ("F", F), ("R", R), ("S", S),
         *window_params(stride, pads, dilation)),
        dtype,
        (("layout", layout), ("out_layout", out_layout), ("pw_epilogue", pw_epilogue)),
        epilogue_tuple(epilogue),
    )


def pw_steps(op: OpSignature) -> tuple[str, ...]:
    """The pointwise half's epilogue steps."""
    text = op.attr("pw_epilogue")
    return () if text == "none" else tuple(text.split("+"))


def pointwise_part(op: OpSignature) -> OpSignature:
    """The 1x1 conv2d the fused op starts with (its output stored as the depthwise reads it)."""
    d = op.dims_dict
    return conv2d_op(d["N"], d["C"], d["H"], d["W"], d["F"], 1, 1, epilogue=pw_steps(op),
                     layout=op.attr("layout"), out_layout=op.attr("out_layout"))


def depthwise_part(op: OpSignature) -> OpSignature:
    """The depthwise conv2d the fused op ends with."""
    d = op.dims_dict
    return conv2d_op(d["N"], d["F"], d["H"], d["W"], d["F"], d["R"], d["S"],
                     stride=(d["stride_h"], d["stride_w"]),
                     pads=(d["pad_t"], d["pad_l"], d["pad_b"], d["pad_r"]),
                     dilation=(d["dil_h"], d["dil_w"]), groups=d["F"], epilogue=op.epilogue,
                     layout=op.attr("out_layout"), out_layout=op.attr("out_layout"))


def _signature_problems(op: OpSignature) -> list[str]:
    d = op.dims_dict
    found = []
    xi, xo = channel_block(op.attr("layout")), channel_block(op.attr("out_layout"))
    if d["F"] % xo:  # out_layout's choices are the blocked layouts only
        found.append(f"F={d['F']} expanded channels must fill whole {xo}-channel blocks")
    if xi and xi != xo:
        found.append(f"layout={op.attr('layout')} and out_layout={op.attr('out_layout')} "
                     "block channels differently; use one block size")
    if len([s for s in op.epilogue if s in ACTIVATIONS]) > 1:
        found.append(f"epilogue {'+'.join(op.epilogue)} has more than one activation")
    return found + kernel_extent_problems(op)


def _arguments(op: OpSignature) -> tuple[TensorArg, ...]:
    d = op.dims_dict
    args = [TensorArg("X", tensor_shape(d["N"], d["C"], d["H"], d["W"], op.attr("layout")),
                      "input"),
            TensorArg("W1", (d["F"], d["C"], 1, 1), "input")]
    if "bias" in pw_steps(op):
        args.append(TensorArg("b1", (d["F"],), "input"))
    args.append(TensorArg("W2", (d["F"], 1, d["R"], d["S"]), "input"))
    if "bias" in op.epilogue:
        args.append(TensorArg("b2", (d["F"],), "input"))
    args.append(TensorArg("Y", tensor_shape(d["N"], d["F"], op.out_h, op.out_w,
                                            op.attr("out_layout")), "output"))
    return tuple(args)


def _flops(op: OpSignature) -> int:
    d = op.dims_dict
    return 2 * d["N"] * d["F"] * (d["H"] * d["W"] * d["C"] + op.out_h * op.out_w * d["R"] * d["S"])


def _reference(op: OpSignature, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    d = op.dims_dict
    named = dict(zip((a.name for a in op.arguments()), inputs, strict=False))
    x = from_layout(named["X"], op.attr("layout"), d["C"])
    e = conv2d_nchw(x, named["W1"], named.get("b1"), (1, 1), (0, 0, 0, 0), (1, 1), 1)
    e = epilogue_reference(tuple(s for s in pw_steps(op) if s != "bias"), e, {})
    y = conv2d_nchw(e, named["W2"], named.get("b2"), (d["stride_h"], d["stride_w"]),
                    (d["pad_t"], d["pad_l"], d["pad_b"], d["pad_r"]),
                    (d["dil_h"], d["dil_w"]), d["F"])
    y = epilogue_reference(tuple(s for s in op.epilogue if s != "bias"), y, {})
    return to_layout(y, op.attr("out_layout"))


def _random_inputs(op: OpSignature, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    d = op.dims_dict
    out = [random_tensor(rng, d["N"], d["C"], d["H"], d["W"], op.attr("layout"))]
    out += [rng.standard_normal(a.shape, dtype=np.float32) for a in op.arguments()[1:-1]]
    return tuple(out)


def _layout_slots(op: OpSignature) -> tuple[str | None, ...]:
    return tuple("in" if a.name == "X" else None for a in op.arguments()[:-1])


def _relayout(op: OpSignature, src: str, dst: str) -> OpSignature | None:
    """A plain or same-block input; the output only blocked."""
    xi, xo = channel_block(src), channel_block(dst)
    if not xo or (xi and xi != xo) or op.dim("F") % xo:
        return None
    return with_attrs(op, layout=src, out_layout=dst)


# -- schedules ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PwdwSchedule(ScheduleData):
    """Knobs of a pwdw kernel.

    ``ow_block`` x ``oh_block``: the depthwise register tile (output pixels, the band's
    channels each); ``pw_block``: pixels of one pointwise register tile (a strip of an
    expanded row); ``band_tiles``: depthwise row tiles per band (the band holds the expanded
    rows they read); ``band_blocks``: Y's channel blocks one band holds (its pixels are that
    many blocks wide, so a register tile has that many vectors per pixel, and each input
    value broadcast in the pointwise half feeds them all); ``parallel``: threads split the
    band's channel groups (``oc``) or the bands (``pixel``).
    """

    family: ClassVar[str] = "pwdw"
    later_knobs: ClassVar[frozenset[str]] = frozenset({"band_blocks"})

    ow_block: int
    pw_block: int
    oh_block: int = 1
    band_tiles: int = 1
    parallel: str = "oc"
    threads: int = 1
    band_blocks: int = 1

    def __str__(self) -> str:
        blocks = f"x{self.band_blocks}" if self.band_blocks != 1 else ""
        return (f"ow{self.ow_block}xoh{self.oh_block} pw{self.pw_block} "
                f"band{self.band_tiles}{blocks} t{self.threads}{self.parallel}")


def block_of(op: OpSignature) -> int:
    """The channel block of the expanded tensor and of Y."""
    return channel_block(op.attr("out_layout"))


def band_channels(op: OpSignature, s: PwdwSchedule) -> int:
    """Channels of one band pixel: ``band_blocks`` of Y's blocks."""
    return block_of(op) * s.band_blocks


def band_rows(op: OpSignature, s: PwdwSchedule) -> int:
    """Padded expanded rows one band holds."""
    d = op.dims_dict
    th = min(s.oh_block, op.out_h)
    return (s.band_tiles * th - 1) * d["stride_h"] + (d["R"] - 1) * d["dil_h"] + 1


def band_floats(op: OpSignature, s: PwdwSchedule) -> int:
    """One thread's band buffer."""
    d = op.dims_dict
    wp = d["W"] + d["pad_l"] + d["pad_r"]
    return round_up(band_rows(op, s) * wp * band_channels(op, s), ALIGN_FLOATS)


def pwdw_problems(op: OpSignature, s: PwdwSchedule, hw: HardwareSpec) -> list[str]:
    """Every reason ``s`` cannot run ``op`` on ``hw``."""
    found = layout_problems((op.attr("layout"), op.attr("out_layout")), hw)
    if found:
        return found
    regs = hw.vector_registers
    if min(s.ow_block, s.oh_block, s.pw_block, s.band_tiles, s.band_blocks) < 1:
        found.append("ow_block, oh_block, pw_block, band_tiles and band_blocks must be at "
                     "least 1")
        return found
    bb = band_channels(op, s)
    nv = bb // hw.lanes
    if op.dim("F") % bb:
        found.append(f"band_blocks={s.band_blocks}: F={op.dim('F')} is not a whole number of "
                     f"bands of {bb} channels")
    if min(s.oh_block, op.out_h) * min(s.ow_block, op.out_w) * nv + nv + 1 > regs:
        found.append(f"the depthwise tile {s.ow_block}x{s.oh_block} of {nv} vector(s) per "
                     f"pixel needs more than {regs} vector registers")
    if min(s.pw_block, op.dim("W")) * nv + nv + 1 > regs:
        found.append(f"the pointwise tile of {s.pw_block} pixels x {nv} vector(s) needs more "
                     f"than {regs} vector registers")
    if s.parallel not in ("oc", "pixel"):
        found.append(f"parallel={s.parallel!r}; expected oc or pixel")
    if s.threads < 1:
        found.append("threads must be at least 1")
    if band_floats(op, s) > MAX_BAND_FLOATS:
        found.append(f"band_tiles={s.band_tiles} makes a band of {band_floats(op, s)} floats "
                     f"per thread; at most {MAX_BAND_FLOATS}")
    return found


def default_pwdw_schedule(op: OpSignature, hw: HardwareSpec, threads: int = 1) -> PwdwSchedule:
    """A depthwise tile of up to 14 pixels of one row, pointwise strips of up to 14 (or what
    the registers hold), bands of 64 KiB, threads over channel blocks when there are enough."""
    nv = max(1, block_of(op) // hw.lanes)
    fit = max(1, (hw.vector_registers - nv - 1) // nv)
    blocks = op.dim("N") * op.dim("F") // max(1, block_of(op))
    s = PwdwSchedule(ow_block=min(op.out_w, 14, fit), pw_block=min(op.dim("W"), 14, fit),
                     parallel="oc" if blocks >= 2 * threads else "pixel", threads=threads)
    tiles = 1
    while (tiles < op.out_h
           and band_floats(op, s.replace(band_tiles=tiles + 1)) <= BAND_BUDGET_FLOATS):
        tiles += 1
    return s.replace(band_tiles=tiles)


# -- code -------------------------------------------------------------------------------------


def _pw_ukr(name: str, width: int, bb: int, op: OpSignature, d: IsaDialect) -> str:
    """``width`` expanded pixels x the ``bb`` channels of a band: the 1x1 conv over C from
    X's row at ``xr`` (plain or blocked), the pointwise epilogue, stored to the band at
    ``dst``."""
    tile = Tile(tuple(str(j) for j in range(width)), bb // d.lanes, d.lanes)
    if channel_block(op.attr("layout")):
        loops = [Loop("for (long cb0 = 0; cb0 < CB0; cb0++)",
                      ("const float *xc = xr + cb0 * (H * W * XB);",
                       "const float *wc = w1 + cb0 * (XB * BB);",
                       "const long nc = cb0 + 1 < CB0 ? XB : C0_TAIL;")),
                 Loop("for (long c = 0; c < nc; c++)")]
        rows = [f"xc[{j} * XB + c]" for j in range(width)]
        columns = "VLOAD(wc + c * BB + {o})"
    else:
        loops = [Loop("for (long c = 0; c < C0; c++)", ("const float *xc = xr + c * (H * W);",))]
        rows = [f"xc[{j}]" for j in range(width)]
        columns = "VLOAD(w1 + c * BB + {o})"
    spec = Store(tuple(f"dst + {j} * BB" for j in range(width)), aligned=True,
                 epilogue=pw_steps(op), operands={"bias": "VLOADU(b1 + {o})"})
    signature = (f"static inline void {name}(const float *restrict xr, const float *restrict w1, "
                 "const float *restrict b1, float *restrict dst)")
    return micro_kernel(signature, tile, loops, columns, rows, spec)


_PACK = """\
/* W1p[cb][c][BB] (the 1x1 weights, a band's BB output channels apart): packed once for a
 * model. */
static void pack_w1(const float *restrict W1, float *restrict w1p, long lo, long hi) {
  for (long cb = lo; cb < hi; cb++)
    for (long c = 0; c < C0; c++)
      for (long l = 0; l < BB; l++) w1p[(cb * C0 + c) * BB + l] = W1[(cb * BB + l) * C0 + c];
}

/* W2p[cb][r*S+s][BB] (the depthwise taps), every call: F*R*S floats. */
static void pack_w2(const float *restrict W2, float *restrict w2p, long lo, long hi) {
  for (long cb = lo; cb < hi; cb++)
    for (long t = 0; t < R * S; t++)
      for (long l = 0; l < BB; l++) w2p[(cb * R * S + t) * BB + l] = W2[(cb * BB + l) * R * S + t];
}
"""


def _fill_row_code(op: OpSignature, s: PwdwSchedule) -> str:
    d = op.dims_dict
    width = min(s.pw_block, d["W"])
    blocked = bool(channel_block(op.attr("layout")))
    row = ("X + ((n * CB0) * H + ih) * (W * XB)" if blocked else "X + (n * C0 * H + ih) * W")
    step = "XB" if blocked else "1"
    tail = d["W"] % width
    call = "pw_full(xr + w * {step}, w1, b1, dst + (PL + w) * BB);"
    if tail:
        call = (f"if (w + {width} <= W) pw_full(xr + w * {step}, w1, b1, dst + (PL + w) * BB);\n"
                f"    else pw_tail(xr + w * {step}, w1, b1, dst + (PL + w) * BB);")
    return f"""\
/* Padded expanded row hp of image n, channel block (w1, b1), into dst: zero outside X. */
static void fill_row(const float *restrict X, const float *restrict w1,
                     const float *restrict b1, float *restrict dst, long n, long hp) {{
  const long ih = hp - PT;
  if (ih < 0 || ih >= H) {{ memset(dst, 0, sizeof(float) * WP * BB); return; }}
  memset(dst, 0, sizeof(float) * PL * BB);
  memset(dst + (PL + W) * BB, 0, sizeof(float) * (WP - PL - W) * BB);
  const float *xr = {row};
  for (long w = 0; w < W; w += {width}) {{
    {call.format(step=step)}
  }}
}}
"""


# The band of a channel block rolls down its rows: the rows two consecutive bands share
# (R - stride of them) move to the top instead of being computed again.
_BODY = """
static void body(const float *restrict X, const float *restrict W1, const float *restrict b1,
                 const float *restrict W2, const float *restrict b2, float *restrict Y,
                 float *ws, int tid, int nth, int packed) {
  const float *w1p = packed ? W1 : ws + OFF_W1;
  {
    long lo, hi; split_range(CBY, tid, nth, &lo, &hi);
    if (!packed) pack_w1(W1, ws + OFF_W1, lo, hi);
    pack_w2(W2, ws + OFF_W2, lo, hi);
  }
  BARRIER();
  float *band = ws + OFF_BAND + tid * BAND_FLOATS;
  float tile[TH * TW * OCB] __attribute__((aligned(64)));
  long it_lo, it_hi, g_lo, g_hi;
  SPLIT
  for (long it = it_lo; it < it_hi; it++) {
    const long n = it / CBY, cb = it % CBY;
    const float *w1 = w1p + cb * C0 * BB, *w2 = ws + OFF_W2 + cb * R * S * BB;
    const float *pb1 = b1 ? b1 + cb * BB : NULL, *pb2 = b2 ? b2 + cb * BB : NULL;
    long have0 = -1, have1 = -1;
    for (long g = g_lo; g < g_hi; g++) {
      const long p0g = g * BAND_TILES * TH, p1g = MIN(P, p0g + BAND_TILES * TH);
      const long h0 = p0g * SH, h1 = MIN(HP, (p1g - 1) * SH + (R - 1) * DH + 1);
      long keep = 0;
      if (h0 >= have0 && h0 < have1) {
        keep = have1 - h0;
        memmove(band, band + (h0 - have0) * WP * BB, sizeof(float) * keep * WP * BB);
      }
      for (long r = keep; r < h1 - h0; r++) fill_row(X, w1, pb1, band + r * WP * BB, n, h0 + r);
      have0 = h0;
      have1 = h1;
      for (long p0 = p0g; p0 < p1g; p0 += TH) {
        const long th = MIN(TH, P - p0);
        for (long qt = 0; qt < NQT; qt++) {
          const long q0 = qt * TW, tw = MIN(TW, Q - q0);
          const float *xb = band + ((p0 - p0g) * SH * WP + q0 * SW) * BB;
          DISPATCH
          float *yp = Y + ((n * CBY + cb) * BAND_BLOCKS * P + p0) * Q * XO + q0 * XO;
          store_tile(tile, yp, pb2, NULL, th, tw, OCB / LANES);
        }
      }
    }
  }
}
"""


def generate_pwdw(op: OpSignature, s: PwdwSchedule, d: IsaDialect) -> str:
    """The C translation unit of ``op`` under ``s`` (validated) for dialect ``d``."""
    dims = op.dims_dict
    xb, bb = block_of(op), band_channels(op, s)
    dw = depthwise_part(op)
    P, Q = op.out_h, op.out_w
    th, tw = min(s.oh_block, P), min(s.ow_block, Q)
    npb, nqt = -(-P // th), -(-Q // tw)
    cby = dims["F"] // bb
    offsets: dict[str, int] = {}
    ws = 0
    for name, floats in (("OFF_W2", dims["F"] * dims["R"] * dims["S"]),
                         ("OFF_W1", dims["F"] * dims["C"])):
        offsets[name] = ws
        ws += round_up(floats, ALIGN_FLOATS)
    offsets["OFF_BAND"] = ws
    ws += s.threads * band_floats(op, s)
    constants: dict[str, int | str] = {
        **shape_constants(dw), "C0": dims["C"], "XB": xb, "BB": bb, "XI": bb, "XO": xb,
        "OCB": bb, "CBY": cby, "BAND_BLOCKS": s.band_blocks, "LANES": d.lanes, "TH": th,
        "TW": tw, "NQT": nqt, "BAND_TILES": s.band_tiles, "BAND_FLOATS": band_floats(op, s),
        "NG": -(-npb // s.band_tiles), "W1P_FLOATS": dims["F"] * dims["C"], **offsets}
    if channel_block(op.attr("layout")):
        cb0 = -(-dims["C"] // xb)
        constants.update(CB0=cb0, C0_TAIL=dims["C"] - (cb0 - 1) * xb)
    width = min(s.pw_block, dims["W"])
    out = [preamble(d, constants, s.threads), *filter(None, [scalar_helpers(op.epilogue)]),
           _PACK, _pw_ukr("pw_full", width, bb, op, d)]
    if dims["W"] % width:
        out.append(_pw_ukr("pw_tail", dims["W"] % width, bb, op, d))
    out.append(_fill_row_code(op, s))
    dw_s = Conv2dSchedule(oc_block=bb, ow_block=tw, ic_block=1, oh_block=th)
    variants = {(th, tw): "ukr_full"}
    variants.setdefault((th, Q - (nqt - 1) * tw), "ukr_qtail")
    variants.setdefault((P - (npb - 1) * th, tw), "ukr_ptail")
    variants.setdefault((P - (npb - 1) * th, Q - (nqt - 1) * tw), "ukr_corner")
    for (vh, vw), name in variants.items():
        out.append(direct_ukr(name, vh, vw, dw_s, d, depthwise=True, xi=bb))
    out.append(y_storage(dw) + blocked_store(dw, dw_s, d.lanes, xb))
    dispatch = "\n          else ".join(f"if (th == {vh} && tw == {vw}) {name}(xb, w2, tile);"
                                        for (vh, vw), name in variants.items())
    split = ("split_range(NB * CBY, tid, nth, &it_lo, &it_hi); g_lo = 0; g_hi = NG;"
             if s.parallel == "oc" else
             "it_lo = 0; it_hi = NB * CBY; split_range(NG, tid, nth, &g_lo, &g_hi);")
    out.append(_BODY.replace("SPLIT", split).replace("DISPATCH", dispatch))
    packed = PackedWeights("W1P_FLOATS", "  pack_w1(weights, packed, 0, CBY);")
    out.append(kernel_entries(
        op, lambda is_packed: f"body(X, W1, b1, W2, b2, Y, ws, TID, NTH, {int(is_packed)});",
        threads=s.threads, ws_floats=f"{ws}L", optional=("b1", "b2"), packed=packed))
    return "\n".join(out)


# -- fusion -----------------------------------------------------------------------------------


def _pointwise(op: OpSignature) -> bool:
    """A plain float32 1x1 conv2d (no stride, padding, groups or residual) writing a blocked
    tensor."""
    if op.kind != CONV2D.name or op.dtype != "float32":
        return False
    d = op.dims_dict
    return ((d["R"], d["S"], d["stride_h"], d["stride_w"]) == (1, 1, 1, 1)
            and not any(d[k] for k in ("pad_t", "pad_l", "pad_b", "pad_r")) and d["groups"] == 1
            and "add" not in op.epilogue and bool(channel_block(op.attr("out_layout"))))


def _depthwise_reader(op: OpSignature, layout: str) -> bool:
    """A depthwise conv2d (one channel per group, no residual) reading and writing ``layout``."""
    return (op.kind == CONV2D.name and is_depthwise(op) and "add" not in op.epilogue
            and op.attr("layout") == op.attr("out_layout") == layout)


def fuse_pointwise_depthwise(producer: OpSignature, reader: OpSignature) -> OpSignature | None:
    """``OpKind.fuses``: a plain 1x1 conv2d writing a blocked tensor and the depthwise conv2d
    reading it, as one pwdw op."""
    if not (_pointwise(producer) and _depthwise_reader(reader, producer.attr("out_layout"))):
        return None
    if not set(reader.epilogue) <= {"bias", *ACTIVATIONS}:
        return None  # an element-wise chain the fused kernel's stores do not apply
    d, e = producer.dims_dict, reader.dims_dict
    return pwdw_op(d["N"], d["C"], d["H"], d["W"], d["F"], e["R"], e["S"],
                   stride=(e["stride_h"], e["stride_w"]),
                   pads=(e["pad_t"], e["pad_l"], e["pad_b"], e["pad_r"]),
                   dilation=(e["dil_h"], e["dil_w"]),
                   pw_epilogue="+".join(producer.epilogue) or "none", epilogue=reader.epilogue,
                   layout=producer.attr("layout"), out_layout=reader.attr("out_layout"))


KIND = register(OpKind(
    name="pwdw",
    spec=KindSpec(
        dims=("N", "C", "H", "W", "F", "R", "S"),
        attrs={"layout": LAYOUTS, "out_layout": tuple(reversed(BLOCKED)),
               "pw_epilogue": PW_EPILOGUES},
        epilogues=("bias", *ACTIVATIONS),
        params={
            "stride_h": (1, 1), "stride_w": (1, 1),
            "pad_t": (0, 0), "pad_l": (0, 0), "pad_b": (0, 0), "pad_r": (0, 0),
            "dil_h": (1, 1), "dil_w": (1, 1),
        },
        check=_signature_problems,
    ),
    arguments=_arguments,
    flops=_flops,
    schedule=PwdwSchedule,
    problems=pwdw_problems,
    default_schedule=default_pwdw_schedule,
    emit=generate_pwdw,
    reference=_reference,
    reduction_length=lambda op: op.dim("C") + op.dim("R") * op.dim("S"),
    dim_columns={
        "N": "dim_batch", "C": "dim_c", "H": "dim_h", "W": "dim_w", "F": "dim_f", "R": "dim_r",
        "S": "dim_s", "stride_h": "stride_h", "stride_w": "stride_w", "pad_t": "pad_t",
        "pad_l": "pad_l", "pad_b": "pad_b", "pad_r": "pad_r", "dil_h": "dil_h",
        "dil_w": "dil_w",
    },
    baseline="numpy",
    prepacked_timing=True,
    random_inputs=_random_inputs,
    layout_slots=_layout_slots,
    relayout=_relayout,
    fuses=fuse_pointwise_depthwise,
    examples=(
        # MobileNet-v2's first expanded block (16 -> 96 channels at 112x112, stride 2) and a
        # stride-1 block reading a plain 24-channel input.
        "pwdw(N=1,C=16,H=112,W=112,F=96,R=3,S=3,stride_h=2,stride_w=2,pad_t=1,pad_l=1,pad_b=1,"
        "pad_r=1,layout=nchw16c,out_layout=nchw16c,pw_epilogue=bias+clip6,epilogue=bias+clip6)",
        "pwdw(N=1,C=24,H=56,W=56,F=144,R=3,S=3,pad_t=1,pad_l=1,pad_b=1,pad_r=1,layout=nchw,"
        "out_layout=nchw16c,pw_epilogue=bias+clip6,epilogue=bias+clip6)",
    ),
))
