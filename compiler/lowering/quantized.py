"""Statically quantized ``MatMul`` and ``Gemm`` (QDQ graphs) onto int8 ``matmul`` kernels.

The pattern, as ``onnxruntime.quantization``, NNCF and torch's exporters write it::

    x (float32) -> QuantizeLinear(s, z) -> DequantizeLinear(s, z) -> MatMul <- W

where ``W`` is a ``DequantizeLinear`` of int8 (or uint8) constants, which the loader folded
into float32 and remembered (:class:`~tunecache.compiler.graph.QuantizedConstant`). It runs
as one int8 kernel reading ``x`` itself (``a_type=float32``: the kernel quantizes it with
``[s, z]`` while packing A, so the quantize/dequantize pair of numpy passes disappears when
nothing else reads it), the int8 weights packed once, and a ``dequant+bias`` epilogue: with
``S[n] = s * s_w[n]`` and ``acc = Σ q_x · q_w``,

    y[m, n] = S[n] * (acc[m, n] - z * Σ_k q_w[k, n]) + bias[n]

so the zero-point term is folded into the bias at compile time. int8 activations (zero
point in -128..127) are shifted to uint8 by adding 128 to the zero point, which quantizes
to the same integers plus 128; uint8 weights with zero point 128 become int8 ones by
subtracting it. A bias ``Add`` and a ``Relu`` after the product fuse in as they do for the
float32 kernel. Anything else (a weight zero point that is not the type's midpoint, scales
per row of A, a ``transA``) leaves the node to the float32 mapping, which multiplies the
dequantized weights: the same numbers, more slowly.

The quantize-dequantize pairs the kernels made redundant are left unread, and
:mod:`.dead` drops them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunecache.compiler.graph import QuantizedConstant
from tunecache.compiler.kinds.conv2d import MIN_LOWP_FILL, block_fill, conv2d_op
from tunecache.compiler.kinds.matmul import matmul_op
from tunecache.compiler.lowering import (
    FusionContext,
    GraphNode,
    clip_step,
    register_lowering,
    scalar_constant,
)
from tunecache.compiler.lowering.matmul import matmul_followers
from tunecache.compiler.onnx_ops.kernel_ops import conv_params

__all__ = ["QuantizePair", "lower_dynamic_matmul", "lower_quantized_conv",
           "lower_quantized_matmul", "per_tensor_params", "quantize_pair"]


NO_INT8 = ("this CPU has no int8 dot product (VNNI, AMX): the float32 kernel on the "
           "dequantized weights runs the QDQ graph as written, faster here")


@dataclass(frozen=True)
class _Activation:
    """The float32 tensor a quantized operand was quantized from, and how: ``zero`` is the
    uint8 zero point (an int8 one plus 128)."""

    source: str
    scale: float
    zero: float


@dataclass(frozen=True)
class _Weights:
    """int8 ``[K, N]`` weights with their per-column scales (zero points all zero)."""

    values: np.ndarray
    scale: np.ndarray


@register_lowering("MatMul", "Gemm")
def lower_quantized_matmul(ctx: FusionContext, position: int) -> Any:
    """The int8 kernel for a MatMul or Gemm whose A is quantized-then-dequantized float32
    and whose B is dequantized int8 constants, or why not."""
    node = ctx.nodes[position]
    act = _activation(ctx, node.inputs[0])
    if isinstance(act, str):
        return act
    if not ctx.int8_kernels:
        return NO_INT8
    gemm = _gemm_form(ctx, node)
    if isinstance(gemm, str):
        return gemm
    trans_b, alpha, bias = gemm
    weights = _weights(ctx.quantized(node.inputs[1]), trans_b)
    if isinstance(weights, str):
        return weights
    a_shape = ctx.shape(act.source)
    k, n = weights.values.shape
    if a_shape is None or not a_shape or a_shape[-1] != k or (
            node.op_type == "Gemm" and len(a_shape) != 2):
        return "A's shape does not fit the weights"
    m = math.prod(a_shape[:-1])
    fused, out, bias, relu = matmul_followers(ctx, position, n, bias, True)
    if bias is not None and bias not in ctx.constants:
        return "a bias that is not a constant"
    scale = (np.float64(act.scale) * alpha) * weights.scale.astype(np.float64)
    folded = _folded_bias(ctx, bias, n, scale, act.zero, weights.values)
    sig = matmul_op(m, n, k, dtype="int8", a_type="float32",
                    epilogue=("dequant", "bias", "relu") if relu else ("dequant", "bias"))
    base = node.name
    inputs = [act.source, ctx.add_typed_constant(f"{base}/B_int8", weights.values),
              ctx.add_constant(f"{base}/qa", np.array([act.scale, act.zero])),
              ctx.add_constant(f"{base}/scale", scale), ctx.add_constant(f"{base}/bias", folded)]
    return ctx.finish(position, fused, sig, inputs, out)


PRODUCTS = ("Conv", "MatMul", "Gemm")
"""The nodes an int8 kernel stands for, reading a quantized activation's float32 source."""


def _activation(ctx: FusionContext, name: str) -> _Activation | str:
    """How ``name`` (a MatMul's A) was quantized: it must be ``DequantizeLinear`` of a
    ``QuantizeLinear`` of float32, both per tensor with the same constant parameters. The
    kernel reads the float32 source, which spares the pair, unless another kind of node
    reads the pair's output: the pair is computed then anyway (folded into the source's
    writer where that is its only reader, :mod:`.chains`), and reading its output, whose
    quantization is the same integers, leaves the source one reader."""
    dq = _producer(ctx, name, "DequantizeLinear")
    q = _producer(ctx, dq.inputs[0], "QuantizeLinear") if dq is not None else None
    if dq is None or q is None:
        return "A is not a quantized activation"
    params = [per_tensor_params(ctx, n) for n in (dq, q)]
    if params[0] is None or params[0] != params[1] or not ctx.is_float32(q.inputs[0]):
        return "A's quantize and dequantize differ, or are not per tensor"
    scale, zero, signed = params[0]
    if not scale > 0.0:
        return "A's scale is not positive"
    others = ctx.is_graph_output(name) or any(
        ctx.nodes[at].op_type not in PRODUCTS for at in ctx.consumers_of(name))
    return _Activation(name if others else q.inputs[0], scale, zero + 128.0 if signed else zero)


def _producer(ctx: FusionContext, name: str, op_type: str) -> GraphNode | None:
    position = ctx.producer(name)
    if position is None or ctx.nodes[position].op_type != op_type:
        return None
    node = ctx.nodes[position]
    return node if int(node.attrs.get("block_size", 0)) == 0 else None


def per_tensor_params(ctx: FusionContext, node: GraphNode) -> tuple[float, float, bool] | None:
    """``(scale, zero point, signed)`` of a per-tensor (de)quantize node with constant
    parameters and an 8-bit type, else None."""
    scale = scalar_constant(ctx, node.inputs[1])
    zero_name = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    zero_array = ctx.constants.get(zero_name) if zero_name else None
    if scale is None or (zero_name and (zero_array is None or zero_array.size != 1)):
        return None
    dtype = zero_array.dtype if zero_array is not None else np.dtype(np.uint8)
    target = node.attrs.get("output_dtype", 0)
    if dtype not in (np.uint8, np.int8) or target not in (0, 2, 3):
        return None
    zero = float(zero_array.reshape(-1)[0]) if zero_array is not None else 0.0
    return scale, zero, dtype == np.int8


@dataclass(frozen=True)
class QuantizePair:
    """A ``QuantizeLinear`` read only by a ``DequantizeLinear`` with the same per-tensor
    parameters: float32 in, float32 on the quantization grid out. ``low``/``high`` are the
    integer type's range less the zero point (the saturation bounds of ``x / scale``)."""

    positions: tuple[int, int]
    output: str
    scale: float
    low: float
    high: float


def quantize_pair(ctx: FusionContext, position: int, value: str) -> QuantizePair | None:
    """The quantize-dequantize pair starting at ``position`` applied to ``value``, or None."""
    q = ctx.nodes[position]
    if q.op_type != "QuantizeLinear" or q.inputs[0] != value or \
            int(q.attrs.get("block_size", 0)):
        return None
    after = ctx.sole_consumer(q.outputs[0])
    if after is None:
        return None
    dq = ctx.nodes[after]
    if dq.op_type != "DequantizeLinear" or dq.inputs[0] != q.outputs[0]:
        return None
    params = per_tensor_params(ctx, q)
    if params is None or params != per_tensor_params(ctx, dq) or not params[0] > 0.0:
        return None
    scale, zero, signed = params
    low, high = (-128.0, 127.0) if signed else (0.0, 255.0)
    return QuantizePair((position, after), dq.outputs[0], scale, low - zero, high - zero)


def _gemm_form(ctx: FusionContext, node: GraphNode) -> tuple[bool, float, str | None] | str:
    """``(transB, alpha, bias)`` of a Gemm, its constant ``beta * C`` as a new bias
    constant (a MatMul: no transpose, 1, no bias)."""
    if node.op_type != "Gemm":
        return False, 1.0, None
    if int(node.attrs.get("transA", 0)):
        return "a Gemm with transA"
    trans_b, alpha = bool(node.attrs.get("transB", 0)), float(node.attrs.get("alpha", 1.0))
    c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    if c is None:
        return trans_b, alpha, None
    value = ctx.constants.get(c)
    b_shape = ctx.shape(node.inputs[1])
    n = (b_shape[0] if trans_b else b_shape[-1]) if b_shape else 0
    if value is None or value.size not in (1, n):
        return "a Gemm whose C is not a constant bias vector"
    beta = float(node.attrs.get("beta", 1.0))
    vector = np.broadcast_to(value.astype(np.float64).reshape(-1), (n,)) * beta
    return trans_b, alpha, ctx.add_constant(f"{node.name}/bias_in", vector)


def _weights(origin: QuantizedConstant | None, trans_b: bool) -> _Weights | str:
    """The int8 ``[K, N]`` weights and per-column scales of a dequantized constant B."""
    if origin is None or origin.values.ndim != 2:
        return "B is not a dequantized 2-D integer constant"
    found = _int8_weights(origin, 0 if trans_b else 1, "B")
    if isinstance(found, str):
        return found
    values, scale = found
    return _Weights(np.ascontiguousarray(values.T if trans_b else values), scale)


def _int8_weights(origin: QuantizedConstant, axis: int, what: str
                  ) -> tuple[np.ndarray, np.ndarray] | str:
    """``origin``'s values as int8 (uint8 ones with zero point 128 moved down by 128) and
    their scales along ``axis``, or why not (scales along another axis, other zero points)."""
    params = origin.along(axis)
    if params is None:
        return f"{what}'s scales vary along another axis"
    scale, zero = params
    midpoint = 128 if origin.values.dtype == np.uint8 else 0
    if np.any(zero != midpoint):
        return f"{what}'s zero points are not all {midpoint}"
    return (origin.values.astype(np.int16) - midpoint).astype(np.int8), scale


def _folded_bias(ctx: FusionContext, bias: str | None, n: int, scale: np.ndarray,
                 zero: float, values: np.ndarray) -> np.ndarray:
    """``bias[n] - scale[n] * zero * Σ_k values[k, n]``: the activation zero point's term."""
    column_sums = values.astype(np.int64).sum(axis=0).astype(np.float64)
    base = np.zeros(n) if bias is None else np.broadcast_to(
        ctx.constants[bias].astype(np.float64).reshape(-1), (n,))
    return base - scale * zero * column_sums


@register_lowering("MatMulInteger")
def lower_dynamic_matmul(ctx: FusionContext, position: int) -> Any:
    """Dynamic quantization as ``onnxruntime.quantization.quantize_dynamic`` writes it::

        DynamicQuantizeLinear(x) -> (q, s, z);  S = Mul(s, w_scale)
        MatMulInteger(q, W, z, w_zero) -> Cast(float) -> Mul(S) [-> Add bias] [-> Relu]

    as one int8 kernel that quantizes ``x`` with its own range (``a_type=dynamic``), or why
    not."""
    node = ctx.nodes[position]
    dql = _producer(ctx, node.inputs[0], "DynamicQuantizeLinear")
    if dql is None or len(node.inputs) < 3 or node.inputs[2] != dql.outputs[2] or \
            not ctx.is_float32(dql.inputs[0]):
        return "A is not DynamicQuantizeLinear's output with its zero point"
    weights = _integer_weights(ctx, node)
    if isinstance(weights, str):
        return weights
    chain = _dequantizing_chain(ctx, position, dql.outputs[1], weights.shape[1])
    if isinstance(chain, str):
        return chain
    fused, w_scale = chain
    k, n = weights.shape
    fused_all, out, bias, relu = matmul_followers(ctx, fused[-1], n, None, True)
    if bias is not None and bias not in ctx.constants:
        return "a bias that is not a constant"
    x_shape = ctx.shape(dql.inputs[0])
    if x_shape is None or not x_shape or x_shape[-1] != k:
        return "A's shape does not fit the weights"
    if not ctx.int8_kernels:
        return _float32_dynamic(ctx, dql, weights * w_scale, bias, relu, out,
                                [position, *fused, *fused_all[1:]])
    sums = weights.astype(np.int64).sum(axis=0).astype(np.float64)
    vector = np.zeros(n) if bias is None else np.broadcast_to(
        ctx.constants[bias].astype(np.float64).reshape(-1), (n,))
    sig = matmul_op(math.prod(x_shape[:-1]), n, k, dtype="int8", a_type="dynamic",
                    epilogue=("dequant", "bias", "relu") if relu else ("dequant", "bias"))
    base = node.name
    inputs = [dql.inputs[0], ctx.add_typed_constant(f"{base}/B_int8", weights),
              ctx.add_constant(f"{base}/scale", w_scale),
              ctx.add_constant(f"{base}/zsum", w_scale * sums),
              ctx.add_constant(f"{base}/bias", vector)]
    return ctx.finish(position, [position, *fused, *fused_all[1:]], sig, inputs, out)


def _float32_dynamic(ctx: FusionContext, dql: GraphNode, weights: np.ndarray,
                     bias: str | None, relu: bool, out: str, fused: list[int]) -> Any:
    """Without an int8 dot product: the float32 matmul of A as dynamically quantized and
    dequantized (``(q - z) * s``, a numpy step beside DynamicQuantizeLinear's) by the
    dequantized weights. The same products as the integer kernel's, in float32 (within a
    few float32 roundings), at float32's speed, where the exact 16-bit-pair int8 product
    is no faster (AVX2: BERT-base's dynamically quantized encoder ran 2.1x onnxruntime)."""
    x_shape = ctx.shape(dql.inputs[0])
    assert x_shape is not None
    a = ctx.add_node("DequantizeLinear", list(dql.outputs), {}, x_shape, np.dtype(np.float32))
    k, n = weights.shape
    epilogue = (("bias",) if bias else ()) + (("relu",) if relu else ())
    sig = matmul_op(math.prod(x_shape[:-1]), n, k, epilogue=epilogue)
    inputs = [a, ctx.add_constant(f"{ctx.nodes[fused[0]].name}/B_dequantized", weights)]
    return ctx.finish(fused[0], fused, sig, inputs + ([bias] if bias else []), out)


def _integer_weights(ctx: FusionContext, node: GraphNode) -> np.ndarray | str:
    """MatMulInteger's constant B as int8 ``[K, N]`` (uint8 ones with zero point 128 moved
    down by 128), or why not."""
    values = ctx.constants.get(node.inputs[1])
    if values is None or values.ndim != 2 or values.dtype not in (np.int8, np.uint8):
        return "B is not a 2-D 8-bit constant"
    midpoint = 128 if values.dtype == np.uint8 else 0
    zero_name = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3] else None
    zero = ctx.constants.get(zero_name) if zero_name else np.array(0)
    if zero is None or np.any(zero.astype(np.int32) != midpoint):
        return f"B's zero points are not all {midpoint}"
    return np.ascontiguousarray((values.astype(np.int16) - midpoint).astype(np.int8))


def _dequantizing_chain(ctx: FusionContext, position: int, a_scale: str, n: int
                        ) -> tuple[list[int], np.ndarray] | str:
    """The ``Cast`` to float and the ``Mul`` by ``a_scale * w_scale`` after the MatMulInteger
    at ``position``: their positions and ``w_scale`` over N, or why not."""
    cast = ctx.sole_consumer(ctx.nodes[position].outputs[0])
    if cast is None or ctx.nodes[cast].op_type != "Cast" or \
            int(ctx.nodes[cast].attrs.get("to", 0)) != 1:
        return "the product is not cast to float"
    mul = ctx.sole_consumer(ctx.nodes[cast].outputs[0])
    if mul is None or ctx.nodes[mul].op_type != "Mul":
        return "the product is not scaled"
    factor = [t for t in ctx.nodes[mul].inputs if t != ctx.nodes[cast].outputs[0]]
    scaler = _producer(ctx, factor[0], "Mul") if len(factor) == 1 else None
    if scaler is None or a_scale not in scaler.inputs:
        return "the product is not scaled by A's scale times B's"
    w_scale = ctx.constants.get(next(t for t in scaler.inputs if t != a_scale), None)
    if w_scale is None or w_scale.size not in (1, n):
        return "B's scale is not a constant per tensor or per column"
    return [cast, mul], np.broadcast_to(w_scale.astype(np.float64).reshape(-1), (n,)).copy()


@register_lowering("Conv")
def lower_quantized_conv(ctx: FusionContext, position: int) -> Any:
    """The int8 conv2d for a statically quantized Conv (quantize-dequantize of float32 X,
    dequantized int8 weights per output channel or per tensor; dense, undilated, 2-D) and a
    following ``Relu`` or ``Clip``, or why not."""
    node = ctx.nodes[position]
    act = _activation(ctx, node.inputs[0])
    if isinstance(act, str):
        return act
    if not ctx.int8_kernels:
        return NO_INT8
    origin = ctx.quantized(node.inputs[1])
    x_shape = ctx.shape(act.source)
    if origin is None or origin.values.ndim != 4 or x_shape is None or len(x_shape) != 4:
        return "not a 2-D convolution of dequantized integer weights"
    weights = _conv_weights(origin)
    if isinstance(weights, str):
        return weights
    p = conv_params(node.attrs, x_shape, origin.values.shape)
    if p.groups != 1 or p.dilation != (1, 1):
        return "a grouped or dilated convolution (int8 convolutions are dense so far)"
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    if bias is not None and bias not in ctx.constants:
        return "a bias that is not a constant"
    values, w_scale = weights
    f, c, r, s = values.shape
    fused, out, epilogue = _conv_activation(ctx, position)
    sig = conv2d_op(*x_shape, f, r, s, stride=p.stride, pads=p.pads, dtype="int8",
                    epilogue=("dequant", "bias", *epilogue))
    if block_fill(sig) < MIN_LOWP_FILL:
        return (f"{c} input channels of {s} taps fill {block_fill(sig):.0%} of an int8 "
                "convolution's 16-channel pixels; the float32 kernel is faster")
    scale = np.float64(act.scale) * w_scale.astype(np.float64)
    sums = values.astype(np.int64).reshape(f, -1).sum(axis=1).astype(np.float64)
    base = np.zeros(f) if bias is None else ctx.constants[bias].astype(np.float64).reshape(-1)
    name = node.name
    inputs = [act.source, ctx.add_typed_constant(f"{name}/W_int8", values),
              ctx.add_constant(f"{name}/qa", np.array([act.scale, act.zero])),
              ctx.add_constant(f"{name}/scale", scale),
              ctx.add_constant(f"{name}/bias", base - scale * act.zero * sums)]
    return ctx.finish(position, fused, sig, inputs, out)


def _conv_weights(origin: QuantizedConstant) -> tuple[np.ndarray, np.ndarray] | str:
    """int8 ``[F, C, R, S]`` weights and their per-output-channel scales."""
    return _int8_weights(origin, 0, "the weights")


def _conv_activation(ctx: FusionContext, position: int) -> tuple[list[int], str, tuple[str, ...]]:
    """The positions fused (the Conv, and a Relu or ReLU6 Clip reading it alone), the tensor
    the kernel writes and the activation step."""
    out = ctx.nodes[position].outputs[0]
    nxt = ctx.sole_consumer(out)
    if nxt is not None:
        follower = ctx.nodes[nxt]
        step = "relu" if follower.op_type == "Relu" else (
            clip_step(ctx, follower.attrs, follower.inputs)
            if follower.op_type == "Clip" and follower.inputs[0] == out else None)
        if step in ("relu", "clip6"):
            return [position, nxt], follower.outputs[0], (step,)
    return [position], out, ()
