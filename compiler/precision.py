"""The compile-time precision policy: which float32 products run in a lower precision.

``fp32`` (the default) runs every kernel as the model says. ``bf16`` runs the products with
constant weights (the ``matmul`` nodes ONNX ``MatMul`` and ``Gemm`` became, and dense,
undilated ``conv2d`` nodes) as bf16 kernels with float32 accumulation, what OpenVINO's CPU
plugin does by default on hardware with bf16 dot products: the weights are rounded to
bfloat16 once, here, and the kernel rounds its float32 activations while packing them, so
the graph around it is unchanged. Products of two activations (attention) and grouped or
depthwise convolutions stay float32 (no bf16 kernels for them yet). On hardware whose
dialect has no bf16 dot product (no
AVX512-BF16 or AMX-BF16) the policy keeps float32 and says so: the widening emulation
would be slower than float32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from tunecache.compiler.backends import backend_for
from tunecache.compiler.elements import to_bfloat16
from tunecache.compiler.graph import Graph, KernelNode, ModelError
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.kinds.matmul import ACTIVATIONS, matmul_op
from tunecache.compiler.ops import OpSignature

__all__ = ["PRECISIONS", "PrecisionPlan", "apply_precision"]

PRECISIONS = ("fp32", "bf16")
MIN_BF16_CHANNELS = 8
"""Convolutions of fewer input channels (an RGB stem) stay float32: the kernel packs
channels in groups of 16."""
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
    steps = [_bf16_node(step, constants) if isinstance(step, KernelNode) else step
             for step in graph.steps]
    changed = sum(a is not b for a, b in zip(steps, graph.steps, strict=True))
    lowered = replace(graph, constants=MappingProxyType(constants), steps=tuple(steps))
    return lowered, PrecisionPlan(precision, "bf16" if changed else "fp32", changed,
                                  "" if changed else "no product with constant weights")


def _bf16_node(node: KernelNode, constants: dict[str, np.ndarray]) -> KernelNode:
    """``node`` as a bf16 kernel when it is a float32 matmul or dense conv2d with constant
    weights and an epilogue the bf16 kernel has; else ``node`` itself."""
    op = node.op
    if op.kind == "conv2d" and op.dtype == "float32":
        return _bf16_conv(node, constants)
    if op.kind != "matmul" or op.dtype != "float32" or op.trans_a:
        return node
    weights = constants.get(node.inputs[1])
    if weights is None or any(step not in ("bias", *ACTIVATIONS) for step in op.epilogue):
        return node
    d = op.dims_dict
    b = weights.reshape((d["N"], d["K"]) if op.trans_b else (d["K"], d["N"]))
    name = f"{node.inputs[1]}/bf16" + ("t" if op.trans_b else "")
    if name not in constants:
        bits = to_bfloat16(b.T if op.trans_b else b)
        bits.flags.writeable = False
        constants[name] = bits
    sig = matmul_op(d["M"], d["N"], d["K"], epilogue=op.epilogue, dtype="bf16",
                    a_type="float32")
    return replace(node, op=sig, inputs=(node.inputs[0], name, *node.inputs[2:]))


def _bf16_conv(node: KernelNode, constants: dict[str, np.ndarray]) -> KernelNode:
    op = node.op
    d = op.dims_dict
    weights = constants.get(node.inputs[1])
    if weights is None or d["groups"] != 1 or (d["dil_h"], d["dil_w"]) != (1, 1) or \
            d["C"] < MIN_BF16_CHANNELS:
        return node
    name = f"{node.inputs[1]}/bf16"
    if name not in constants:
        bits = to_bfloat16(weights)
        bits.flags.writeable = False
        constants[name] = bits
    sig = OpSignature(op.kind, op.dims, "bf16", op.attrs, op.epilogue)
    return replace(node, op=sig, inputs=(node.inputs[0], name, *node.inputs[2:]))
