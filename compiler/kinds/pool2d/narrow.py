"""The activations a pool2d holds narrow: bfloat16 for a bf16 one between bf16 kernels,
uint8 for an int8 max pool between int8 kernels.

A bf16 pool2d (the precision policy's :func:`bf16_variant` of a blocked float32 one) may
hold its input ``x``, its output ``y`` or both as bfloat16: a max of bfloat16 values is one
of them, an average sums them in float32. An int8 pool2d is a max pool holding both as uint8
of one quantizer (``narrow=x+y``): the quantizer is monotonic, so the max of the bytes is the
byte of the max, and the values pass through unchanged
(:mod:`tunecache.compiler.lowering.u8` hands them on), in any layout (NCHW before the layout
planner blocks it). A bf16 one runs the blocked kernels only.
"""

from __future__ import annotations

from dataclasses import replace

from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import narrow_tensors
from tunecache.compiler.kinds.layouts import TILE_ROW_LAYOUT, with_attrs
from tunecache.compiler.kinds.pool2d.space import is_blocked
from tunecache.compiler.ops import OpSignature

__all__ = ["NARROW", "bf16_variant", "narrow_problems", "narrow_type", "with_narrow"]

NARROW = ("none", "x", "y", "x+y")
"""What a pool2d holds narrow: its input X, its output Y, or both."""
_BOTH = frozenset({"x", "y"})


def narrow_type(op: OpSignature) -> str:
    """The element type of the tensors ``op`` holds narrow: uint8 for an int8 pool2d, else
    bfloat16."""
    return "uint8" if op.dtype == "int8" else "bfloat16"


def narrow_problems(op: OpSignature) -> list[str]:
    """Why ``op``'s dtype, ``narrow`` and layout do not go together (empty when they do)."""
    found = []
    held = narrow_tensors(op)
    if held and (op.dtype == "float32" or (op.dtype == "bf16" and not is_blocked(op))):
        found.append(f"narrow={op.attr('narrow')}: a pool2d holds narrow tensors as a bf16 op "
                     f"in a blocked layout (nchw16c, nchw32c) or an int8 one; got "
                     f"dtype={op.dtype}, layout={op.attr('layout')}")
    if op.dtype == "int8" and (held != _BOTH or op.attr("mode") != "max" or op.epilogue):
        found.append(f"an int8 pool2d is a max pool holding X and Y as uint8, no epilogue "
                     f"(mode=max, narrow=x+y); got mode={op.attr('mode')}, "
                     f"narrow={op.attr('narrow')}, epilogue={'+'.join(op.epilogue) or 'none'}")
    if op.attr("layout") == TILE_ROW_LAYOUT and op.dtype != "bf16":
        found.append(f"{TILE_ROW_LAYOUT} holds bfloat16 between bf16 kernels only")
    return found


def bf16_variant(op: OpSignature, hw: HardwareSpec) -> tuple[OpSignature, None] | None:
    """``OpKind.bf16_variant``: a blocked float32 pool2d as a bf16 one, which may then hold
    its input and output as bfloat16 between bf16 kernels (:func:`with_narrow`)."""
    if op.dtype != "float32" or not is_blocked(op):
        return None
    return replace(op, dtype="bf16"), None


def with_narrow(op: OpSignature, tensors: frozenset[str]) -> OpSignature | None:
    """``OpKind.with_narrow``: a bf16 pool2d in a blocked layout holding ``tensors`` (``x``,
    ``y``) and those it held as bfloat16; a float32 max pool without an epilogue asked for
    both as the int8 one holding them as uint8; None for anything else."""
    if op.dtype == "float32" and tensors == _BOTH and op.attr("mode") == "max" \
            and not op.epilogue and op.attr("layout") != TILE_ROW_LAYOUT:
        attrs = tuple((k, "x+y" if k == "narrow" else v) for k, v in op.attrs)
        return OpSignature(op.kind, op.dims, "int8", attrs, op.epilogue)
    held = narrow_tensors(op) | tensors
    if op.dtype != "bf16" or not is_blocked(op) or not held <= _BOTH:
        return None
    return with_attrs(op, narrow="+".join(t for t in ("x", "y") if t in held))
