"""Local response normalisation (ONNX ``LRN``) onto the ``lrn`` kind.

The window runs along axis 1 only, so a float32 input of any rank from 3 up is the kind's
``[N, C, H, W]`` with the axes after the second flattened into ``H`` (and ``W = 1``) when
there are not exactly two of them. ``alpha``, ``beta`` and ``bias`` become the kernel's
constant ``coef`` input."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.kinds.lrn import lrn_op
from tunecache.compiler.lowering import FusionContext, register_lowering

# ONNX's defaults for the optional attributes.
_ALPHA, _BETA, _BIAS = 1e-4, 0.75, 1.0


@register_lowering("LRN")
def lower_lrn(ctx: FusionContext, position: int) -> Any:
    node = ctx.nodes[position]
    x = node.inputs[0]
    shape = ctx.shape(x)
    if shape is None or len(shape) < 3 or not ctx.is_float32(x):
        return "LRN is lowered for float32 tensors of rank 3 or more, of known shape"
    n, c, *rest = shape
    h, w = (rest[0], rest[1]) if len(rest) == 2 else (math.prod(rest), 1)
    try:
        sig = lrn_op(n, c, h, w, int(node.attrs.get("size", 0)))
    except OpSignatureError as exc:
        return f"no lrn signature: {exc}"
    coef = np.array([node.attrs.get("alpha", _ALPHA), node.attrs.get("beta", _BETA),
                     node.attrs.get("bias", _BIAS)], dtype=np.float32)
    return ctx.finish(position, [position], sig, [x, ctx.add_constant(f"{node.name}/coef", coef)],
                      node.outputs[0])
