"""Upsampling ops as kernels and copies: ConvTranspose becomes a conv2d kernel (every phase
at once) and an interleave, matching onnxruntime over strides, pads, output padding,
dilations, groups and 1-D (the forms the rewrite leaves alone still run, in the reference,
and match); DepthToSpace and SpaceToDepth become one native strided copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("onnxruntime")

from onnx_support import compile_and_compare, op_model, ort_run

from tunecache.cache.store import Store
from tunecache.compiler.frontend import load_graph
from tunecache.tuner.deploy import compile_model


def _model(x: list[int], w: list[int], *, bias: bool = True, opset: int = 17,
           follow: str | None = None, **attrs: Any) -> onnx.ModelProto:
    rng = np.random.default_rng(len(x) + sum(w))
    inits = {"w": rng.standard_normal(w).astype(np.float32)}
    if bias:
        inits["b"] = rng.standard_normal(w[1] * int(attrs.get("group", 1))).astype(np.float32)
    return op_model("ConvTranspose", x, inits, follow=follow, opset=opset, **attrs)


CASES = {
    # U-Net's upsampling: kernel = stride, no pads: one 1x1 conv per phase
    "unet-k2s2": ([1, 8, 5, 6], [8, 4, 2, 2], {"strides": [2, 2]}),
    # DCGAN / pix2pix: k4 s2 p1, every phase a 2x2 correlation, a crop of one
    "dcgan-k4s2p1": ([2, 6, 4, 4], [6, 5, 4, 4], {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    # fast style transfer: k3 s2 p1 with output_padding 1 (zero taps in one phase)
    "k3s2p1op1": ([1, 4, 5, 7], [4, 3, 3, 3], {"strides": [2, 2], "pads": [1, 1, 1, 1],
                                               "output_padding": [1, 1]}),
    "asymmetric": ([1, 3, 6, 5], [3, 4, 3, 2], {"strides": [3, 2], "pads": [0, 1, 2, 0]}),
    "stride1": ([1, 5, 6, 6], [5, 7, 3, 3], {"pads": [1, 1, 1, 1]}),
    "stride1-crop": ([1, 3, 6, 6], [3, 2, 2, 2], {"pads": [2, 0, 1, 3]}),
    "stride1-dilated": ([1, 3, 7, 7], [3, 4, 3, 3], {"dilations": [2, 2], "pads": [1, 0, 2, 1]}),
    "groups": ([1, 6, 4, 5], [6, 2, 4, 4], {"strides": [2, 2], "pads": [1, 1, 1, 1],
                                            "group": 3}),
    "depthwise": ([1, 4, 5, 5], [4, 1, 3, 3], {"strides": [2, 2], "group": 4}),
    "1d": ([2, 4, 9], [4, 6, 4], {"strides": [2], "pads": [1, 1]}),
    "valid": ([1, 4, 3, 3], [4, 4, 3, 3], {"strides": [2, 2], "auto_pad": "VALID"}),
    "stride-beyond-kernel": ([1, 2, 3, 4], [2, 3, 2, 2], {"strides": [3, 3],
                                                          "output_padding": [2, 1]}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_conv_transpose_is_a_conv_kernel_and_matches_onnxruntime(case: str,
                                                                  tmp_path: Path) -> None:
    x, w, attrs = CASES[case]
    model = _model(x, w, **attrs)
    graph = load_graph(model)
    assert "ConvTranspose" not in {n.op_type for n in graph.onnx_nodes}
    assert "conv2d" in {k.op.kind for k in graph.kernel_nodes}
    compile_and_compare(model, tmp_path)


def test_relu_after_it_and_no_bias_match(tmp_path: Path) -> None:
    model = _model([1, 4, 6, 6], [4, 3, 4, 4], bias=False, follow="Relu", strides=[2, 2],
                   pads=[1, 1, 1, 1])
    compile_and_compare(model, tmp_path)


def test_opset_9_crops_with_the_slice_it_reads(tmp_path: Path) -> None:
    model = _model([1, 3, 4, 4], [3, 2, 4, 4], opset=9, strides=[2, 2], pads=[1, 1, 1, 1])
    assert {n.op_type for n in load_graph(model).onnx_nodes} <= {"Reshape", "Transpose",
                                                                 "Slice"}
    compile_and_compare(model, tmp_path)


@pytest.mark.parametrize(("attrs", "x"), [
    ({"strides": [2, 2], "output_shape": [9, 9]}, [1, 3, 4, 4]),
    ({"strides": [2, 2], "auto_pad": "SAME_UPPER"}, [1, 3, 4, 4]),
    ({"strides": [2, 2], "dilations": [2, 2]}, [1, 3, 4, 4]),
], ids=["output-shape", "same-upper", "strided-dilated"])
def test_forms_left_to_the_reference_still_match(attrs: dict[str, Any], x: list[int],
                                                 tmp_path: Path) -> None:
    model = _model(x, [3, 2, 3, 3], **attrs)
    assert "ConvTranspose" in {n.op_type for n in load_graph(model).onnx_nodes}
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic")
    feeds = {"x": np.random.default_rng(1).standard_normal(x).astype(np.float32)}
    np.testing.assert_allclose(compiled.run(feeds)["y"], ort_run(model, feeds)[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("op", "mode", "x"), [
    ("DepthToSpace", "DCR", [2, 12, 3, 5]), ("DepthToSpace", "CRD", [1, 18, 4, 2]),
    ("SpaceToDepth", None, [1, 3, 6, 9])], ids=["d2s-dcr", "d2s-crd", "s2d"])
def test_depth_space_are_strided_copies_and_match(op: str, mode: str | None, x: list[int],
                                                  tmp_path: Path) -> None:
    """Sub-pixel upsampling after a convolution (ESPCN's), as one native copy."""
    block = 3 if op == "SpaceToDepth" or mode == "CRD" else 2
    attrs: dict[str, Any] = {"blocksize": block} | ({"mode": mode} if mode else {})
    w = numpy_helper.from_array(
        np.random.default_rng(4).standard_normal((x[1], x[1], 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node(op, ["c"], ["y"], **attrs)], "pixel",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    assert {n.op_type for n in load_graph(model).onnx_nodes} <= {"Reshape", "Transpose"}
    compiled = compile_and_compare(model, tmp_path)
    assert compiled.program is not None and compiled.program.numpy_steps == 0
