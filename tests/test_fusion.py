"""Kernel-pair fusion (compiler/fusion.py) on graphs built here: which pairs fuse, where the
fused node goes, what a reshaping node between them becomes, and what must stay apart."""

from __future__ import annotations

import numpy as np

from tunecache.compiler.fusion import fuse_pairs, fused_op
from tunecache.compiler.graph import Graph, KernelNode, OnnxNode, TensorInfo
from tunecache.compiler.kinds.elementwise import elementwise_op
from tunecache.compiler.kinds.matmul import matmul_op

F32 = np.dtype(np.float32)
MM = matmul_op(6, 10, 4, epilogue="bias")
GELU = elementwise_op(6, 10, "gelu_erf")


def _kernel(name: str, op, inputs: tuple[str, ...], output: str) -> KernelNode:  # type: ignore[no-untyped-def]
    return KernelNode(name, (name,), op, inputs, output, op.arguments()[-1].shape)


def _graph(steps: list, outputs: tuple[str, ...] = ("y",)) -> Graph:  # type: ignore[type-arg]
    return Graph("g", 17, (TensorInfo("a", (6, 4), F32),),
                 tuple(TensorInfo(o, (6, 10), F32) for o in outputs), {}, tuple(steps))


def test_an_activation_reading_a_matmul_becomes_its_epilogue() -> None:
    assert fused_op(MM, GELU) == matmul_op(6, 10, 4, epilogue="bias+gelu_erf")
    assert fused_op(matmul_op(6, 10, 4, epilogue="relu"), GELU) is None  # one activation
    assert fused_op(MM, elementwise_op(6, 10, "gelu_erf+relu")) is None
    assert fused_op(MM, elementwise_op(6, 10, "add")) is None  # a second operand
    assert fused_op(MM, elementwise_op(3, 20, "gelu_erf")) is None  # other rows
    assert fused_op(MM, elementwise_op(6, 10, "sigmoid")) is None  # not an epilogue


def test_the_fused_node_replaces_both_at_the_readers_place() -> None:
    steps = [_kernel("mm", MM, ("a", "w", "b"), "h"),
             OnnxNode("other", "Relu", ("a",), ("r",), {}),
             _kernel("act", GELU, ("h",), "y")]
    fused, count = fuse_pairs(_graph(steps))
    assert count == 1
    assert [s.name for s in fused.steps] == ["other", "mm+act"]
    node = fused.steps[1]
    assert isinstance(node, KernelNode)
    assert node.inputs == ("a", "w", "b") and node.output == "y"
    assert node.op.epilogue == ("bias", "gelu_erf") and node.nodes == ("mm", "act")


def test_a_reshape_between_stays_and_names_the_readers_output() -> None:
    steps = [_kernel("mm", MM, ("a", "w", "b"), "h"),
             OnnxNode("view", "Reshape", ("h", "shape"), ("h3",), {}),
             _kernel("act", GELU, ("h3",), "y")]
    fused, count = fuse_pairs(_graph(steps))
    assert count == 1
    mm, view = fused.steps
    assert isinstance(mm, KernelNode) and isinstance(view, OnnxNode)
    assert mm.name == "mm+act" and mm.output == "h" and mm.op.epilogue == ("bias", "gelu_erf")
    assert view.inputs == ("h", "shape") and view.outputs == ("y",)


def test_a_tensor_read_twice_or_returned_is_not_fused_away() -> None:
    twice = [_kernel("mm", MM, ("a", "w", "b"), "h"),
             _kernel("act", GELU, ("h",), "y"),
             OnnxNode("peek", "Relu", ("h",), ("z",), {})]
    graph = _graph(twice, ("y", "z"))
    assert fuse_pairs(graph) == (graph, 0)
    returned = _graph(twice[:2], ("y", "h"))
    assert fuse_pairs(returned) == (returned, 0)
