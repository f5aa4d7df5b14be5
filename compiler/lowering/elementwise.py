"""Chains of element-wise ONNX nodes onto the ``elementwise`` kind: one kernel per chain.

A chain starts at an element-wise node and follows the only reader of its result while that
reader is element-wise too and keeps the shape: ``Relu``, ``Sigmoid``, ``Tanh``, ``Exp``,
``Neg``, ``Abs``, ``Sqrt``, ``Clip(0, 6)`` (ReLU6) and ``Clip(0, inf)``, the patterns ``x *
Sigmoid(x)`` (SiLU), ``x * 0.5 * (1 + Erf(x / sqrt 2))`` (GELU as the exporters write it)
and its tanh form (GPT-2's, with ``Pow(x, 3)``), and ``Add``/``Sub``/``Mul``/``Div`` with
one operand that is the running value and another that broadcasts to it. Every extra operand
of one kernel must broadcast the same way (``full``, per ``row``, per ``col``umn block or
``scalar``, see the kind): constants are re-laid out to fit (a per-channel constant of an
NCHW tensor with batch 2 is tiled to ``N*C`` rows), tensors must already fit. The chain
stops before a node that does not fit. Another lowering may start a chain with steps of its
own (:class:`ChainSeed`: an inference BatchNormalization's ``mul+add``), which then grows
the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tunecache.compiler.errors import OpSignatureError
from tunecache.compiler.kinds.elementwise import MAX_STEPS, elementwise_op
from tunecache.compiler.lowering import (
    FusionContext,
    GraphNode,
    activation_step,
    clip_step,
    other_input,
    register_lowering,
    scalar_constant,
    silu_nodes,
)
from tunecache.compiler.lowering.quantized import quantize_pair

UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Neg": "neg",
         "Abs": "abs", "Sqrt": "sqrt", "Erf": "erf", "Mish": "mish", "Softplus": "softplus"}
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}
HARD = ("HardSwish", "HardSigmoid", "Gelu")
PARAMETRIC = {"LeakyRelu": (("prelu", "alpha", 0.01),),
              "Elu": (("elu", "alpha", 1.0),),
              "Selu": (("elu", "alpha", 1.67326319217681884765625),
                       ("mul", "gamma", 1.05070102214813232421875))}
"""Activations that are binary steps with scalar operands from their attributes (name,
default): ``(step, attribute, default)`` in order."""

"""Their steps come from :func:`~tunecache.compiler.lowering.activation_step` (HardSigmoid's
and Gelu's attributes decide)."""
_SQRT2 = math.sqrt(2.0)
_GELU_TANH_C = math.sqrt(2.0 / math.pi)


@dataclass
class _Chain:
    """A chain being grown: its steps, operands and the (M, N) view they need."""

    shape: tuple[int, ...]
    steps: list[str] = field(default_factory=list)
    operands: list[str] = field(default_factory=list)
    fused: list[int] = field(default_factory=list)
    kind: str | None = None
    split: int | None = None
    """``M = prod(shape[:split])`` rows of ``N = prod(shape[split:])``."""

    def rows_cols(self) -> tuple[int, int]:
        split = len(self.shape) - 1 if self.split is None else self.split
        return math.prod(self.shape[:split]), math.prod(self.shape[split:])


def _broadcast(operand: tuple[int, ...], shape: tuple[int, ...]) -> tuple[str, int | None] | None:
    """How a tensor of shape ``operand`` broadcasts over ``shape`` without copying, or None."""
    if len(operand) > len(shape):
        return None
    o = (1,) * (len(shape) - len(operand)) + operand
    if o == shape:
        return "full", None
    if math.prod(o) == 1:
        return "scalar", None
    varying = [i for i, d in enumerate(o) if d != 1]
    if any(o[i] != shape[i] for i in varying):
        return None
    first, last = varying[0], varying[-1] + 1
    if all(o[i] == shape[i] for i in range(first, len(shape))):
        return "row", first
    if all(o[i] == shape[i] for i in range(last)):
        return "col", last
    return None


def _fits(value: np.ndarray, shape: tuple[int, ...], kind: str, split: int | None) -> bool:
    """Whether a constant broadcast over ``shape`` is expressible as ``kind`` at ``split``."""
    try:
        full = np.broadcast_to(value, shape)
    except ValueError:
        return False
    if kind == "full":
        return True
    rows = math.prod(shape[:split]) if split is not None else 1
    table = full.reshape(rows, -1)
    if kind == "scalar":
        return bool((table == table.flat[0]).all())
    if kind == "row":
        return bool((table == table[:1]).all())
    return bool((table == table[:, :1]).all())


class _Grower:
    def __init__(self, ctx: FusionContext, position: int) -> None:
        self.ctx = ctx
        node = ctx.nodes[position]
        shape = ctx.shape(node.outputs[0])
        self.chain = _Chain(shape) if shape is not None else None
        self.constants: list[tuple[int, np.ndarray]] = []  # (operand index, value)
        self.scalars = 0  # constants of one element among them

    def operand(self, name: str) -> bool:
        """Add an operand if it fits the chain's broadcast so far."""
        chain, ctx = self.chain, self.ctx
        assert chain is not None
        value = ctx.constants.get(name)
        if value is not None:
            return self.constant(name, value)
        shape = ctx.shape(name)
        if shape is None or not ctx.is_float32(name):
            return False
        how = _broadcast(shape, chain.shape)
        if how is None or (how[0] == "full" and self.scalars):
            return False  # no scalar streamed as a whole tensor (a quantizer's, say)
        kind, split = how
        if chain.kind is not None and (kind, split) != (chain.kind, chain.split) and not (
                kind == chain.kind and split is None):
            return False
        if not all(_fits(v, chain.shape, kind, split) for _, v in self.constants):
            return False
        chain.kind, chain.split = kind, split if split is not None else chain.split
        chain.operands.append(name)
        return True

    def constant(self, name: str, value: np.ndarray) -> bool:
        """Add a constant operand (``name`` also names its re-laid-out copy) if it fits."""
        chain = self.chain
        assert chain is not None
        if value.dtype != np.float32 or not self._constant_fits(value):
            return False
        self.scalars += value.size == 1
        self.constants.append((len(chain.operands), value))
        chain.operands.append(name)
        return True

    def _constant_fits(self, value: np.ndarray) -> bool:
        chain = self.chain
        assert chain is not None
        if chain.kind is not None:
            return _fits(value, chain.shape, chain.kind, chain.split)
        return _fits(value, chain.shape, "full", None)

    def settle(self) -> None:
        """Choose the cheapest broadcast every constant fits when no tensor operand did."""
        chain = self.chain
        assert chain is not None
        if chain.kind is not None or not chain.operands:
            chain.kind = chain.kind or "full"
            return
        shape = chain.shape
        options: list[tuple[str, int | None]] = [("scalar", None)]
        for _, value in self.constants:
            how = _broadcast(tuple(value.shape), shape)
            if how is not None:
                options.append(how)
        options.append(("full", None))
        for kind, split in options:
            if all(_fits(v, shape, kind, split) for _, v in self.constants):
                chain.kind, chain.split = kind, split
                return

    def operand_arrays(self) -> list[str]:
        """The operand names, constants re-laid out as the chosen broadcast needs."""
        chain, ctx = self.chain, self.ctx
        assert chain is not None and chain.kind is not None
        m, n = chain.rows_cols()
        names = list(chain.operands)
        for index, value in self.constants:
            table = np.broadcast_to(value, chain.shape).reshape(m, n)
            laid = {"full": table, "row": table[0], "col": table[:, 0],
                    "scalar": table.reshape(-1)[:1]}[chain.kind]
            names[index] = ctx.add_constant(f"{names[index]}/{chain.kind}",
                                            np.ascontiguousarray(laid))
        return names


def _gelu(ctx: FusionContext, position: int, value: str) -> list[int] | None:
    """GELU as the exporters write it, ``value * 0.5 * (1 + Erf(value / sqrt2))``, in any
    association of the two products, starting at the node at ``position`` (the division or
    the halving, whichever comes first): the positions of its five nodes, last one last."""
    node = ctx.nodes[position]
    if node.op_type not in ("Div", "Mul") or len(node.inputs) != 2 or value not in node.inputs:
        return None
    if _is_half(ctx, node, value):  # 0.5 * value first, then * (1 + erf)
        return _half_first(ctx, position, value, _erf_core_of)
    core = _erf_core(ctx, position, value)
    if core is None:
        return None
    current = ctx.nodes[core[-1]].outputs[0]
    rest: list[tuple[int, str | None]] = []
    while len(rest) < 2:
        nxt = ctx.sole_consumer(current)
        if nxt is None or ctx.nodes[nxt].op_type != "Mul":
            return None
        other = other_input(ctx.nodes[nxt].inputs, current)
        half = _producer_if_half(ctx, other, value, nxt)
        if half is not None and not rest:  # (1 + erf) * (0.5 * value)
            return sorted([*core, half, nxt])
        if other != value and scalar_constant(ctx, other) != 0.5:
            return None
        rest.append((nxt, other))
        current = ctx.nodes[nxt].outputs[0]
    others = [o for _, o in rest]
    if value not in others or not any(scalar_constant(ctx, o) == 0.5 for o in others):
        return None
    return [*core, *(p for p, _ in rest)]


def _half_first(ctx: FusionContext, position: int, value: str,
                core_of: Callable[[FusionContext, str | None, str], list[int] | None]
                ) -> list[int] | None:
    """A GELU written halving first, ``(value * 0.5) * core``: the halving at ``position``,
    the nodes ``core_of`` finds producing the other factor, and the product, in order."""
    outer = ctx.sole_consumer(ctx.nodes[position].outputs[0])
    if outer is None or ctx.nodes[outer].op_type != "Mul":
        return None
    core = core_of(ctx, other_input(ctx.nodes[outer].inputs, ctx.nodes[position].outputs[0]),
                   value)
    return None if core is None else sorted([position, *core, outer])


def _is_half(ctx: FusionContext, node: GraphNode, value: str) -> bool:
    return node.op_type == "Mul" and scalar_constant(ctx, other_input(node.inputs, value)) == 0.5


def _producer_if_half(ctx: FusionContext, tensor: str | None, value: str, user: int
                      ) -> int | None:
    """The position of ``Mul(value, 0.5)`` producing ``tensor`` for ``user`` alone."""
    position = ctx.producer(tensor) if tensor else None
    if position is None or not _is_half(ctx, ctx.nodes[position], value) or \
            ctx.sole_consumer(tensor or "") != user:
        return None
    return position


def _erf_core(ctx: FusionContext, position: int, value: str) -> list[int] | None:
    """``value / sqrt2 -> Erf -> + 1`` from the division at ``position``."""
    first = ctx.nodes[position]
    if first.op_type not in ("Div", "Mul") or first.inputs[0] != value:
        return None
    factor = scalar_constant(ctx, first.inputs[1])
    expected = _SQRT2 if first.op_type == "Div" else 1.0 / _SQRT2
    if factor is None or not math.isclose(factor, expected, rel_tol=1e-5):
        return None
    erf = ctx.sole_consumer(first.outputs[0])
    if erf is None or ctx.nodes[erf].op_type != "Erf":
        return None
    plus = ctx.sole_consumer(ctx.nodes[erf].outputs[0])
    if plus is None or ctx.nodes[plus].op_type != "Add" or \
            scalar_constant(ctx, other_input(ctx.nodes[plus].inputs, ctx.nodes[erf].outputs[0])) != 1.0:
        return None
    return [position, erf, plus]


def _erf_core_of(ctx: FusionContext, tensor: str | None, value: str) -> list[int] | None:
    """The ``value / sqrt2 -> Erf -> + 1`` nodes that produce ``tensor``."""
    plus = ctx.producer(tensor) if tensor else None
    if plus is None:
        return None
    for operand in ctx.nodes[plus].inputs:
        erf = ctx.producer(operand)
        if erf is not None and ctx.nodes[erf].op_type == "Erf":
            first = ctx.producer(ctx.nodes[erf].inputs[0])
            core = _erf_core(ctx, first, value) if first is not None else None
            if core is not None and core[-1] == plus:
                return core
    return None


def _gelu_tanh(ctx: FusionContext, position: int, value: str) -> list[int] | None:
    """GELU's tanh form as GPT-2 exports it, ``(value * 0.5) * (1 + Tanh(c * (value + 0.044715
    * Pow(value, 3))))`` with ``c = sqrt(2/pi)``, starting at the halving or the Pow (whichever
    comes first): the positions of its eight nodes, last one last."""
    node = ctx.nodes[position]
    if _is_half(ctx, node, value):
        return _half_first(ctx, position, value, _tanh_core_of)
    core = _tanh_core(ctx, position, value)
    if core is None:
        return None
    plus = ctx.nodes[core[-1]].outputs[0]
    outer = ctx.sole_consumer(plus)
    if outer is None or ctx.nodes[outer].op_type != "Mul":
        return None
    half = _producer_if_half(ctx, other_input(ctx.nodes[outer].inputs, plus), value, outer)
    return None if half is None else sorted([*core, half, outer])


def _tanh_core(ctx: FusionContext, position: int, value: str) -> list[int] | None:
    """``Pow(value, 3) * 0.044715 + value -> * sqrt(2/pi) -> Tanh -> + 1`` from the Pow at
    ``position``: six positions."""
    first = ctx.nodes[position]
    if first.op_type != "Pow" or first.inputs[0] != value or \
            scalar_constant(ctx, first.inputs[1]) != 3.0:
        return None
    chain = [position]
    current = first.outputs[0]
    for op_type, constant in (("Mul", 0.044715), ("Add", None), ("Mul", _GELU_TANH_C),
                              ("Tanh", None), ("Add", 1.0)):
        nxt = ctx.sole_consumer(current)
        if nxt is None or ctx.nodes[nxt].op_type != op_type:
            return None
        node = ctx.nodes[nxt]
        if op_type != "Tanh":
            other = other_input(node.inputs, current)
            if constant is None and other != value:
                return None
            found = scalar_constant(ctx, other) if constant is not None else None
            if constant is not None and (found is None or
                                         not math.isclose(found, constant, rel_tol=1e-5)):
                return None
        chain.append(nxt)
        current = node.outputs[0]
    return chain


def _tanh_core_of(ctx: FusionContext, tensor: str | None, value: str) -> list[int] | None:
    """The :func:`_tanh_core` nodes that produce ``tensor``."""
    position = ctx.producer(tensor) if tensor else None
    for _ in range(6):  # back from the + 1 to the Pow: six nodes
        if position is None:
            return None
        node = ctx.nodes[position]
        if node.op_type == "Pow":
            core = _tanh_core(ctx, position, value)
            return core if core is not None and \
                ctx.nodes[core[-1]].outputs[0] == tensor else None
        inputs = [t for t in node.inputs if t != value and t not in ctx.constants]
        position = ctx.producer(inputs[0]) if len(inputs) == 1 else None
    return None


def _fake_quant(ctx: FusionContext, grower: _Grower, position: int, value: str,
                first: bool) -> tuple[list[str], list[int]] | None:
    """A quantize-dequantize pair on the running value as five steps. Not inside a chain
    whose value a product reads quantized: an int8 kernel reads that value itself (see
    :mod:`.quantized`), so it must stay a tensor, and the chain starts at the pair instead."""
    pair = quantize_pair(ctx, position, value)
    assert grower.chain is not None
    # Its four scalars would be streamed as whole tensors in a chain of full operands.
    if pair is None or (not first and _feeds_product(ctx, pair.output)) or \
            len(grower.chain.steps) + 5 > MAX_STEPS or grower.chain.kind == "full":
        return None
    base = ctx.nodes[position].name
    operands = [(f"{base}/scale", pair.scale), (f"{base}/low", pair.low),
                (f"{base}/high", pair.high), (f"{base}/scale", pair.scale)]
    if not all(grower.constant(name, np.array(v, np.float32)) for name, v in operands):
        return None
    return ["div", "max", "min", "qround", "mul"], list(pair.positions)


def _feeds_product(ctx: FusionContext, tensor: str) -> bool:
    readers = ctx.consumers(tensor)
    return readers is None or any(ctx.nodes[p].op_type in ("MatMul", "Gemm", "Conv")
                                  for p in readers)


def _step(ctx: FusionContext, grower: _Grower, position: int, value: str, first: bool = False
          ) -> tuple[list[str], list[int]] | None:
    """The steps and node positions of the pattern starting at ``position`` applied to the
    running ``value`` (``first``: the chain's first node), or None when it does not continue
    the chain."""
    node = ctx.nodes[position]
    if node.op_type == "QuantizeLinear":
        return _fake_quant(ctx, grower, position, value, first)
    if (fused := _gelu(ctx, position, value)) is not None:
        return ["gelu_erf"], fused
    if (fused := _gelu_tanh(ctx, position, value)) is not None:
        return ["gelu_tanh"], fused
    if (fused := silu_nodes(ctx, position, value)) is not None:
        return ["silu"], fused
    if node.inputs[0] != value and node.op_type not in ("Add", "Mul", "Sub"):
        return None
    if node.op_type in UNARY:
        return [UNARY[node.op_type]], [position]
    if (step := activation_step(node)) is not None:
        return [step], [position]
    if node.op_type == "Clip":
        step = clip_step(ctx, node.attrs, node.inputs)
        return ([step], [position]) if step else None
    if node.op_type in PARAMETRIC:
        return _parametric(grower, node, position)
    if node.op_type == "PRelu":
        slope = node.inputs[1]
        return (["prelu"], [position]) if slope != value and grower.operand(slope) else None
    if node.op_type not in BINARY or len(node.inputs) != 2:
        return None
    other = other_input(node.inputs, value)
    if other is None or other == value:
        return None
    swapped = node.inputs[1] == value
    if (swapped and node.op_type == "Div") or not grower.operand(other):
        return None  # other / value has no step
    if swapped and node.op_type == "Sub":  # other - value
        return ["neg", "add"], [position]
    return [BINARY[node.op_type]], [position]


def _parametric(grower: _Grower, node: GraphNode, position: int
                ) -> tuple[list[str], list[int]] | None:
    """A :data:`PARAMETRIC` activation's steps, its attributes as scalar operands."""
    steps = PARAMETRIC[node.op_type]
    assert grower.chain is not None
    if grower.chain.kind == "full":
        return None  # its scalars would be streamed as whole tensors
    if not all(grower.constant(f"{node.name}/{attr}",
                               np.array([node.attrs.get(attr, default)], np.float32))
               for _, attr, default in steps):
        return None
    return [step for step, _, _ in steps], [position]


def _start_value(ctx: FusionContext, position: int, shape: tuple[int, ...]) -> str | None:
    node = ctx.nodes[position]
    candidates = [t for t in node.inputs[:2] if t and t not in ctx.constants
                  and ctx.shape(t) == shape and ctx.is_float32(t)]
    return candidates[0] if candidates else None


def lower_chain(ctx: FusionContext, position: int) -> Any:
    grower = _Grower(ctx, position)
    chain = grower.chain
    if chain is None or not chain.shape:
        return "element-wise chains need a known, non-scalar shape"
    value = _start_value(ctx, position, chain.shape)
    if value is None:
        return "no float32 input of the output's shape to stream"
    return _grow(ctx, grower, position, value, value, position)


@dataclass(frozen=True)
class ChainSeed:
    """The first steps of a chain, worked out by another lowering (a BatchNormalization's
    ``mul+add``): the chain continues with the element-wise nodes that follow it.

    ``constants`` hold one operand per binary step in ``steps``, each broadcastable to
    ``output``'s shape and expressible as ``operand`` at ``split`` (see ``_Chain``), which
    every later operand must then share.
    """

    value: str
    """The streamed input, of ``output``'s shape."""
    output: str
    """The tensor the seed's nodes produce."""
    fused: tuple[int, ...]
    steps: tuple[str, ...]
    constants: tuple[tuple[str, np.ndarray], ...]
    """``(name, value)``: the name is the base of the re-laid-out constant's."""
    operand: str
    split: int | None


def lower_seeded(ctx: FusionContext, position: int, seed: ChainSeed) -> Any:
    """An elementwise kernel for ``seed``'s steps and the chain that follows its output."""
    grower = _Grower(ctx, position)
    chain = grower.chain
    if chain is None or not chain.shape or ctx.shape(seed.output) != chain.shape:
        return "element-wise chains need a known, non-scalar shape"
    chain.kind, chain.split = seed.operand, seed.split
    if not all(grower.constant(name, value) for name, value in seed.constants):
        return f"the seed's constants do not broadcast as {seed.operand}"
    chain.steps += seed.steps
    chain.fused += seed.fused
    return _grow(ctx, grower, position, seed.value, seed.output, ctx.sole_consumer(seed.output))


def _grow(ctx: FusionContext, grower: _Grower, position: int, first_input: str, current: str,
          at: int | None) -> Any:
    """Extend ``grower``'s chain over ``current`` from the node at ``at`` and finish it."""
    chain = grower.chain
    assert chain is not None
    while at is not None and len(chain.steps) < MAX_STEPS - 1:
        if ctx.shape(ctx.nodes[at].outputs[0]) != chain.shape:
            break
        found = _step(ctx, grower, at, current, first=at == position and not chain.steps)
        if found is None:
            break
        steps, fused = found
        chain.steps += steps
        chain.fused += fused
        current = ctx.nodes[fused[-1]].outputs[0]
        at = ctx.sole_consumer(current)
    if not chain.steps:
        return "not an element-wise pattern the kind covers"
    grower.settle()
    m, n = chain.rows_cols()
    try:
        sig = elementwise_op(m, n, tuple(chain.steps), operand=chain.kind or "full")
    except OpSignatureError as exc:
        return f"no elementwise signature: {exc}"
    return ctx.finish(position, chain.fused, sig, [first_input, *grower.operand_arrays()],
                      current)


# Pow: where GELU's tanh form starts; QuantizeLinear: a quantize-dequantize pair.
for _op_type in (*UNARY, *BINARY, "Clip", "Pow", "QuantizeLinear", *HARD, *PARAMETRIC, "PRelu"):
    register_lowering(_op_type)(lower_chain)
