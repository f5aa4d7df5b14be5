"""The compile-time precision policy: which float32 products run in a lower precision.

``fp32`` (the default) runs every kernel as the model says. ``bf16`` runs the products with
constant weights whose kind has a bf16 kernel for them (``OpKind.bf16_variant``: matmuls,
dense undilated convolutions) as bf16 kernels with float32 accumulation, what OpenVINO's CPU
plugin does by default on hardware with bf16 dot products: the weights are rounded to
bfloat16 once, here, and the kernel rounds its float32 activations while packing them; an
activation only bf16 kernels write and read flows between them as bfloat16
(:mod:`tunecache.compiler.lowering.bf16`). Depthwise convolutions become bf16 ones: the
float32 kernel on weights of bfloat16 values, reading and writing bfloat16 activations, so
those stay narrow through a MobileNet block. Fused attention becomes a bf16 one on bf16
matrix tiles (AMX), which rounds Q, K and V as it packs them; elsewhere it and the other
products of two activations stay float32, as do grouped convolutions (no bf16 kernels for
them yet). On hardware whose
dialect has no bf16 dot product (no
AVX512-BF16 or AMX-BF16) the policy keeps float32 and says so: the widening emulation
would be slower than float32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from tunecache.compiler.backends import backend_for
from tunecache.compiler.elements import from_bfloat16, to_bfloat16
from tunecache.compiler.fusion import KeepApart
from tunecache.compiler.graph import Graph, KernelNode, ModelError
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds import op_kind
from tunecache.compiler.lowering.bf16 import bfloat16_activations
from tunecache.compiler.ops import OpSignature

__all__ = ["PRECISIONS", "PrecisionPlan", "apply_precision", "int8_kernels_pay",
           "lowered_apart"]

PRECISIONS = ("fp32", "bf16")
"""The precisions a model can be compiled at."""


@dataclass(frozen=True)
class PrecisionPlan:
    """What the policy did: the precision asked for and the one used, how many kernel
    nodes it lowered, and why it kept float32 where it did (empty when it did not)."""

    requested: str
    used: str
    nodes: int
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"requested": self.requested, "used": self.used, "nodes": self.nodes,
                "note": self.note}


def int8_kernels_pay(hw: HardwareSpec) -> bool:
    """Whether a statically quantized (QDQ) product runs as an int8 kernel on ``hw``: where
    its dialect has an int8 dot product (AVX512-VNNI, AMX). Elsewhere the float32 kernel on
    the dequantized weights computes the QDQ graph as written, and faster: without VNNI an
    exact int8 product is 16-bit pairs (``vpmaddwd``), at best float32's speed, while
    float32 keeps Winograd and the tuned tiles (ResNet-50 int8 QDQ, one thread, Zen 3:
    135.6 ms as int8 kernels, 90.4 ms as float32 ones). Dynamically quantized products
    (MatMulInteger) stay int8 everywhere: their float32 form would be numpy."""
    return "int8" in backend_for(hw).dialect(hw).native


def apply_precision(graph: Graph, hw: HardwareSpec, precision: str) -> tuple[Graph, PrecisionPlan]:
    """``graph`` with its eligible products at ``precision`` on ``hw``, and the plan."""
    if precision not in PRECISIONS:
        raise ModelError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return graph, PrecisionPlan("fp32", "fp32", 0)
    if "bf16" not in backend_for(hw).dialect(hw).native:
        return graph, PrecisionPlan(precision, "fp32", 0, f"{hw.hw_id} has no bf16 dot "
                                    "product (AVX512-BF16 or AMX-BF16): compiled in fp32")
    constants = dict(graph.constants)
    steps = [_bf16_node(step, constants, hw) if isinstance(step, KernelNode) else step
             for step in graph.steps]
    changed = sum(a is not b for a, b in zip(steps, graph.steps, strict=True))
    tiles = any(dtype == "bf16" for dtype, _ in backend_for(hw).dialect(hw).tiles)
    steps = bfloat16_activations(steps, frozenset(t.name for t in graph.outputs), tiles)
    lowered = replace(graph, constants=MappingProxyType(constants), steps=tuple(steps))
    return lowered, PrecisionPlan(precision, "bf16" if changed else "fp32", changed,
                                  "" if changed else "no product with constant weights")


def lowered_apart(graph: Graph, hw: HardwareSpec, precision: str) -> KeepApart | None:
    """The fusion veto (``fusion.KeepApart``) of ``precision`` on ``hw``: at ``bf16``, a
    producer the policy would lower (a bf16 variant, constant weights) stays apart from a
    reader where the fused op would stay float32, so the product runs on bf16 tiles. None
    where the policy lowers nothing.

    MobileNet-v2 at bf16 on the AMX Xeon, one thread: its 1x1 expansions fused with their
    depthwise layers (pwdw, float32) ran 3.92 ms; left apart, the expansions as bf16 tile
    kernels, 3.37 ms (the 14x14 and 7x7 ones, 96-160 channels in, 0.12-0.15 -> 0.03-0.05 ms
    each with their depthwise layers)."""
    if precision != "bf16" or "bf16" not in backend_for(hw).dialect(hw).native:
        return None

    def lowers(op: OpSignature) -> bool:
        variant = op_kind(op.kind).bf16_variant
        return variant is not None and variant(op, hw) is not None

    def keep_apart(producer: KernelNode, fused: OpSignature) -> bool:
        return (len(producer.inputs) > 1 and producer.inputs[1] in graph.constants
                and lowers(producer.op) and not lowers(fused))
    return keep_apart


def _bf16_node(node: KernelNode, constants: dict[str, np.ndarray],
               hw: HardwareSpec) -> KernelNode:
    """``node`` as its kind's bf16 kernel (``OpKind.bf16_variant``) when it has one and
    constant weights, those rounded to bfloat16 once (per weights and orientation); else
    ``node`` itself."""
    variant = op_kind(node.op.kind).bf16_variant
    found = variant(node.op, hw) if variant is not None else None
    if found is not None and found[1] is None:
        return replace(node, op=found[0])  # no weights: the kernel rounds its inputs
    weights = constants.get(node.inputs[1]) if found is not None else None
    if found is None or weights is None:
        return node
    sig, transposed = found
    as_floats = sig.arguments()[1].dtype == "float32"  # bfloat16 values a float kernel reads
    name = f"{node.inputs[1]}/bf16" + ("t" if transposed else "") + ("f" if as_floats else "")
    if name not in constants:
        shaped = weights.reshape(node.op.arguments()[1].shape)
        bits = to_bfloat16(shaped.T if transposed else shaped)
        rounded = from_bfloat16(bits) if as_floats else bits
        rounded.flags.writeable = False
        constants[name] = rounded
    return replace(node, op=sig, inputs=(node.inputs[0], name, *node.inputs[2:]))
