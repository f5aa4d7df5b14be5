"""A 3-D convolution becomes one conv2d kernel over depth-gathered channels and matches
onnxruntime over depth strides, pads, dilations, 1-deep kernels, bias and batch; the forms
left to the reference still run and match."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

from onnx_support import compile_and_compare, op_model

from tunecache.compiler.frontend import load_graph
from tunecache.compiler.onnx_ops.registry import engine


def _model(x: list[int], w: list[int], bias: bool = True, follow: str | None = None,
           **attrs: Any) -> onnx.ModelProto:
    rng = np.random.default_rng(sum(x) + sum(w))
    inits = {"w": rng.standard_normal(w).astype(np.float32)}
    if bias:
        inits["b"] = rng.standard_normal(w[0]).astype(np.float32)
    return op_model("Conv", x, inits, follow=follow, **attrs)


CASES: dict[str, tuple[list[int], list[int], dict[str, Any]]] = {
    "r3d-stem": ([1, 3, 6, 12, 12], [8, 3, 3, 7, 7], {"strides": [1, 2, 2],
                                                       "pads": [1, 3, 3, 1, 3, 3]}),
    "3x3x3": ([2, 4, 5, 7, 6], [6, 4, 3, 3, 3], {"pads": [1, 1, 1, 1, 1, 1]}),
    "depth-stride": ([1, 4, 9, 6, 6], [5, 4, 3, 1, 1], {"strides": [2, 1, 1],
                                                          "pads": [1, 0, 0, 0, 0, 0]}),
    "r2plus1d-spatial": ([1, 4, 4, 8, 8], [6, 4, 1, 3, 3], {"pads": [0, 1, 1, 0, 1, 1]}),
    "temporal-dilated": ([1, 3, 10, 5, 5], [4, 3, 3, 1, 1], {"dilations": [2, 1, 1],
                                                              "pads": [2, 0, 0, 1, 0, 0]}),
    "valid": ([1, 2, 4, 5, 5], [3, 2, 2, 2, 2], {"auto_pad": "VALID"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_conv3d_is_one_conv2d_kernel_and_matches(case: str, tmp_path: Path) -> None:
    x, w, attrs = CASES[case]
    model = _model(x, w, **attrs)
    graph = load_graph(model)
    assert [k.op.kind for k in graph.kernel_nodes] == ["conv2d"]
    assert "Conv" not in {n.op_type for n in graph.onnx_nodes}
    compile_and_compare(model, tmp_path)


def test_relu_after_it_and_no_bias(tmp_path: Path) -> None:
    compile_and_compare(_model([1, 3, 4, 6, 6], [4, 3, 3, 3, 3], bias=False, follow="Relu",
                               pads=[1] * 6), tmp_path)


def test_grouped_conv3d_is_left_to_the_reference_and_matches(tmp_path: Path) -> None:
    model = _model([1, 4, 3, 5, 5], [4, 2, 3, 3, 3], group=2, pads=[1] * 6)
    [node] = [n for n in load_graph(model).onnx_nodes if n.op_type == "Conv"]
    # named for what runs it: set up once with the plan, not numpy's Conv handing it on
    assert engine("Conv", 17, node.attrs) == "reference"
    assert engine("Conv", 17, {"kernel_shape": [3, 3], "pads": [1] * 4}) == "numpy"
    compile_and_compare(model, tmp_path)
