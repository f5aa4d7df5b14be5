"""What every conv2d emitter shares: the shape constants and the kernel entries."""

from __future__ import annotations

from tunecache.compiler.codegen.abi import PackedWeights, kernel_entries
from tunecache.compiler.codegen.epilogue import CHANNEL_OPERAND
from tunecache.compiler.codegen.isa import BF16_SCALAR
from tunecache.compiler.kinds import narrow_tensors
from tunecache.compiler.ops import OpSignature


def shape_constants(op: OpSignature) -> dict[str, int | str]:
    """The convolution's shape as C constants (every conv2d kernel's ``#define`` block)."""
    d = op.dims_dict
    return {
        "NB": d["N"], "C": d["C"], "H": d["H"], "W": d["W"], "F": d["F"], "R": d["R"],
        "S": d["S"], "SH": d["stride_h"], "SW": d["stride_w"], "PT": d["pad_t"],
        "PL": d["pad_l"], "DH": d["dil_h"], "DW": d["dil_w"], "G": d["groups"],
        "CG": d["C"] // d["groups"], "FG": d["F"] // d["groups"], "P": op.out_h,
        "Q": op.out_w, "HP": d["H"] + d["pad_t"] + d["pad_b"],
        "WP": d["W"] + d["pad_l"] + d["pad_r"],
    }




def y_storage(op: OpSignature) -> str:
    """C of Y's element type ``ty_t`` and its stores: ``TY(u)`` one value, ``TY_STORE(p, v)``
    a vector; float, uint8 where ``op`` writes its output quantized (``narrow=...y``, the
    epilogue's values whole numbers in 0..255 by then), or bfloat16 where a bf16 ``op``
    writes it narrow (after :data:`BF16_SCALAR`)."""
    if "y" in narrow_tensors(op):
        if op.dtype == "bf16":
            return ("typedef uint16_t ty_t;\n#define TY(u) tc_bf16_round(u)\n"
                    "#define TY_STORE(p, v) VSTORE_BF16((p), (v))\n")
        return ("#include <stdint.h>\ntypedef uint8_t ty_t;\n#define TY(u) ((uint8_t)(int)(u))\n"
                "#define TY_STORE(p, v) VSTORE_U8((p), (v))\n")
    return "typedef float ty_t;\n#define TY(u) (u)\n#define TY_STORE(p, v) VSTOREU((p), (v))\n"


def x_storage(op: OpSignature) -> str:
    """C of the direct kernel's X element type ``tx_t``, ``X_NARROW`` and ``TX(v)`` (one
    element's value, widened as its rows are copied): float, uint8 where a float32
    depthwise ``op`` reads X quantized (``narrow=x``, dequantized with ``xq``), or bfloat16
    where a bf16 depthwise one reads it narrow (after :data:`BF16_SCALAR`)."""
    if "x" not in narrow_tensors(op):
        return "typedef float tx_t;\n#define X_NARROW 0\n#define TX(v) (v)\n"
    if op.dtype == "bf16":
        return "typedef uint16_t tx_t;\n#define X_NARROW 1\n#define TX(v) tc_bf16_value(v)\n"
    return ("#include <stdint.h>\ntypedef uint8_t tx_t;\n#define X_NARROW 1\n"
            "#define TX(v) (((float)(v) - xq[1]) * xq[0])\n")


def bf16_scalar(op: OpSignature) -> str:
    """:data:`BF16_SCALAR` where a bf16 ``op`` holds a tensor narrow, else nothing."""
    return BF16_SCALAR if op.dtype == "bf16" and narrow_tensors(op) else ""


def conv2d_entries(op: OpSignature, threads: int, ws_floats: str, prepack: bool,
                   items: str = "WPACK_ITEMS", packed_ws_floats: str | None = None,
                   chain: bool = False) -> str:
    """``tc_kernel`` and ``tc_time`` around ``conv_body``; with ``prepack``, also the
    pre-packed-weights ABI.

    ``tc_pack_weights`` writes W (F x C/g x R x S) into the layout the kernel reads
    (``WB_FLOATS`` floats, by ``pack_weights`` over ``items``); ``tc_kernel_packed`` reads that
    buffer in W's place and skips the per-call repacking. Constant weights are packed once,
    when a model is compiled. ``packed_ws_floats``: the packed entry's smaller workspace,
    when the per-call packing has its own region at the end of ``ws_floats``. With
    ``chain``, ``conv_body`` takes the chain rows (``chan``, NULL without) after ``add``, and Y
    as :func:`y_storage`'s ``ty_t``.
    """
    packed = PackedWeights("WB_FLOATS", f"  pack_weights(weights, packed, 0, {items});")
    x, rows, y = ("(const tx_t *)X", " chan, xq,", "(ty_t *)Y") if chain else ("X", "", "Y")
    return kernel_entries(
        op, lambda is_packed: f"conv_body({x}, Wt, bias, add,{rows} {y}, ws, TID, NTH, "
                              f"{int(is_packed)});",
        threads=threads, ws_floats=ws_floats, rename={"W": "Wt"},
        optional=("bias", "add", CHANNEL_OPERAND, "xq") if chain else ("bias", "add"),
        packed=packed if prepack else None, packed_ws_floats=packed_ws_floats)
