"""Inference ``BatchNormalization`` onto the ``elementwise`` kind: ``x * scale + shift``.

With constant parameters the normalisation is one multiply and one add per channel:
``scale = gamma / sqrt(var + epsilon)`` and ``shift = beta - mean * scale``, folded at load
time (in float64, stored as float32). The kernel streams the input once as ``mul+add`` with
per-channel operands, which the elementwise lowering's chain then extends over the
element-wise nodes that follow (a ``Relu``, ``Clip(0, 6)``...), so a pre-activation
BN-ReLU is one kernel. An ``N, C, D1...`` input is ``N*C`` rows of ``D1*...`` floats with
``col`` operands (tiled once per batch item); an ``N, C`` input is ``N`` rows of ``C`` with
``row`` operands. A BatchNormalization right after a ``Conv`` never gets here: the Conv
lowering (:mod:`tunecache.compiler.lowering.conv`) folds it into the convolution's weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tunecache.compiler.lowering import FusionContext, register_lowering
from tunecache.compiler.lowering.elementwise import ChainSeed, lower_seeded


def folded_parameters(params: list[np.ndarray], epsilon: float
                      ) -> tuple[np.ndarray, np.ndarray]:
    """``(scale, shift)`` in float32 for ``gamma, beta, mean, var`` (1-D, one per channel)."""
    gamma, beta, mean, var = (np.asarray(p, dtype=np.float64).reshape(-1) for p in params)
    scale = gamma / np.sqrt(var + epsilon)
    return scale.astype(np.float32), (beta - mean * scale).astype(np.float32)


@register_lowering("BatchNormalization")
def lower_batchnorm(ctx: FusionContext, position: int) -> Any:
    node = ctx.nodes[position]
    x, out = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    if shape is None or len(shape) < 2 or not ctx.is_float32(x) or ctx.shape(out) != shape:
        return "BatchNormalization is lowered for float32 inputs of known rank >= 2 shape"
    if any(node.outputs[1:]):
        return "the running statistics outputs are named (training-style node)"
    if int(node.attrs.get("spatial", 1)) != 1:
        return "spatial=0 (parameters per channel and position)"
    if len(node.inputs) < 5:
        return "missing parameters"
    params = [ctx.constants.get(t) for t in node.inputs[1:5]]
    channels = shape[1]
    arrays = [p for p in params if p is not None and p.size == channels and p.ndim == 1]
    if len(arrays) != 4:
        return "scale, bias, mean and var must be constant vectors of one value per channel"
    scale, shift = folded_parameters(arrays, float(node.attrs.get("epsilon", 1e-5)))
    laid = (channels,) + (1,) * (len(shape) - 2)
    seed = ChainSeed(
        value=x, output=out, fused=(position,), steps=("mul", "add"),
        constants=((f"{node.name}/scale", scale.reshape(laid)),
                   (f"{node.name}/shift", shift.reshape(laid))),
        operand="row" if len(shape) == 2 else "col", split=1 if len(shape) == 2 else 2)
    return lower_seeded(ctx, position, seed)
