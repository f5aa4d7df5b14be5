"""A convolution's taps that only ever read padding are cropped from its weights (DeepLab's
atrous rates wider than the feature map): the kernel computes the same outputs with fewer
taps, and matches onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("onnxruntime")

from onnx_support import compile_and_compare

from tunecache.compiler.frontend import load_graph


def _dilated(size: int, dilation: int, pads: list[int], stride: int = 1,
             kernel: int = 3) -> onnx.ModelProto:
    rng = np.random.default_rng(dilation)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8, kernel, kernel)).astype(
        np.float32), "w"), numpy_helper.from_array(rng.standard_normal(16).astype(np.float32),
                                                   "b")]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], dilations=[dilation, dilation],
                          pads=pads, strides=[stride, stride], name="atrous"),
         helper.make_node("Relu", ["c"], ["y"])],
        "atrous", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(("size", "dilation", "pads", "stride", "kernel_hw", "pads_after"), [
    (6, 12, [12, 12, 12, 12], 1, (1, 1), (0, 0, 0, 0)),   # only the centre tap reads
    (6, 4, [4, 4, 4, 4], 1, (3, 3), (4, 4, 4, 4)),        # every tap reads somewhere
    (5, 3, [3, 0, 3, 9], 1, (3, 2), (3, 0, 3, 6)),        # right column only reads padding
    (7, 8, [8, 8, 8, 8], 2, (1, 1), (0, 0, 0, 0)),        # strided
], ids=["centre-only", "all-live", "one-side", "strided"])
def test_dead_taps_are_cropped_and_outputs_match_onnxruntime(
        size: int, dilation: int, pads: list[int], stride: int, kernel_hw: tuple[int, int],
        pads_after: tuple[int, int, int, int], tmp_path: Path) -> None:
    model = _dilated(size, dilation, pads, stride)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    [conv] = load_graph(path).kernel_nodes
    dims = conv.op.dims_dict
    assert (dims["R"], dims["S"]) == kernel_hw
    assert tuple(dims[a] for a in ("pad_t", "pad_l", "pad_b", "pad_r")) == pads_after
    compile_and_compare(model, tmp_path)
