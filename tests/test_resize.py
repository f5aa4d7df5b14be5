"""Resize in numpy (one interpolation matrix per axis) against onnx's reference and
onnxruntime: every mode, coordinate mode and nearest mode, cubic coefficients,
exclude_outside, antialias, crops with extrapolation, axes, the aspect-ratio policies,
scales and sizes, integer images; and a segmentation model's upsampling runs here, not in
the reference."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tunecache.compiler.onnx_ops import implementation

COORDINATES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
               "asymmetric", "tf_crop_and_resize")


def _model(attrs: dict[str, Any], given: list[str], dtype: int) -> onnx.ModelProto:
    types = {"x": dtype, "roi": TensorProto.FLOAT, "scales": TensorProto.FLOAT,
             "sizes": TensorProto.INT64}
    graph = helper.make_graph(
        [helper.make_node("Resize", [n if n in given else "" for n in types], ["y"], **attrs)],
        "r", [helper.make_tensor_value_info(n, types[n], None) for n in given],
        [helper.make_tensor_value_info("y", dtype, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def _compare(x: np.ndarray, attrs: dict[str, Any], roi: list[float], scales: list[float],
             sizes: list[int], judges: tuple[str, ...] = ("reference", "onnxruntime")) -> None:
    """Ours against the reference and onnxruntime (``judges``) on one Resize; empty lists
    are omitted inputs."""
    values = [x, np.array(roi, np.float32), np.array(scales, np.float32),
              np.array(sizes, np.int64)]
    feeds = {n: v for n, v in zip(["x", "roi", "scales", "sizes"], values, strict=True)
             if n == "x" or v.size}
    model = _model(attrs, list(feeds), helper.np_dtype_to_tensor_dtype(x.dtype))
    impl = implementation("Resize")
    assert impl is not None
    [ours] = impl([v if v.size else None for v in values], attrs, 19)
    assert ours.dtype == x.dtype
    if "reference" in judges:
        [expected] = ReferenceEvaluator(model).run(None, feeds)
        np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5, err_msg=str(attrs))
    if "onnxruntime" in judges:
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(ours, session.run(None, feeds)[0], rtol=1e-4, atol=1e-4,
                                   err_msg=str(attrs))


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coordinates", COORDINATES)
def test_every_mode_and_coordinate_mode(mode: str, coordinates: str) -> None:
    rng = np.random.default_rng(len(mode) * 7 + len(coordinates))
    x = rng.standard_normal((1, 2, 5, 7)).astype(np.float32)
    roi = [0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2] if coordinates == "tf_crop_and_resize" else []
    for scales, sizes in (([1, 1, 2.0, 1.5], []), ([1, 1, 0.6, 0.5], []), ([], [1, 2, 9, 4]),
                          ([], [1, 2, 1, 13])):
        attrs = {"mode": mode, "coordinate_transformation_mode": coordinates,
                 "extrapolation_value": -3.0}
        judges = _judges(coordinates, x.shape, scales)
        if mode == "cubic" and coordinates == "pytorch_half_pixel" and 1 in sizes:
            judges = ("reference",)  # onnxruntime's cubic at position -0.5 differs
        _compare(x, attrs, roi, scales, sizes, judges)


def _judges(coordinates: str, shape: tuple[int, ...], scales: list[float]) -> tuple[str, ...]:
    """Who decides where the two disagree: with a scale whose output length is not whole,
    ``align_corners`` and ``tf_crop_and_resize`` divide by the unrounded length in the
    reference (ONNX's own) and by the rounded one in onnxruntime; we follow the reference.
    The reference's ``half_pixel_symmetric`` misses a neighbour where a position lands an
    ulp past a whole number; we agree with onnxruntime there."""
    if coordinates == "half_pixel_symmetric":
        return ("onnxruntime",)
    fractional = any(s * n != int(s * n) for s, n in zip(np.float32(scales), shape,
                                                           strict=False))
    if fractional and coordinates in ("align_corners", "tf_crop_and_resize"):
        return ("reference",)
    return ("reference", "onnxruntime")


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor",
                                          "ceil"])
def test_nearest_modes_and_integer_images(nearest_mode: str) -> None:
    x = np.random.default_rng(1).integers(0, 255, (1, 3, 6, 5)).astype(np.uint8)
    for coordinates in ("asymmetric", "half_pixel", "align_corners"):
        scales = [1, 1, 2.5, 1.7]
        _compare(x, {"mode": "nearest", "nearest_mode": nearest_mode,
                     "coordinate_transformation_mode": coordinates}, [], scales, [],
                 _judges(coordinates, x.shape, scales))


@pytest.mark.parametrize(("mode", "a", "exclude"), [("cubic", -0.5, 1), ("cubic", -0.75, 1),
                                                    ("linear", -0.75, 1)])
def test_cubic_coefficient_and_exclude_outside(mode: str, a: float, exclude: int) -> None:
    x = np.random.default_rng(2).standard_normal((2, 3, 4, 6)).astype(np.float32)
    # onnxruntime refuses exclude_outside on a linear Resize without antialias
    _compare(x, {"mode": mode, "cubic_coeff_a": a, "exclude_outside": exclude},
             [], [1, 1, 1.75, 0.6], [], ("reference",) if mode == "linear" else
             ("reference", "onnxruntime"))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialiased_downscales(mode: str) -> None:
    x = np.random.default_rng(3).standard_normal((1, 2, 17, 23)).astype(np.float32)
    for scales in ([1, 1, 0.5, 0.3], [1, 1, 0.8, 1.6]):
        _compare(x, {"mode": mode, "antialias": 1}, [], scales, [])


def test_axes_and_aspect_ratio_policies() -> None:
    x = np.random.default_rng(4).standard_normal((2, 7, 5, 3)).astype(np.float32)
    for policy, axes in itertools.product(("stretch", "not_larger", "not_smaller"),
                                          ([1, 2], [3, 2])):
        _compare(x, {"mode": "linear", "axes": axes, "keep_aspect_ratio_policy": policy}, [],
                 [], [11, 8])
    # onnxruntime's cubic resizes the last two axes only
    _compare(x, {"mode": "cubic", "axes": [3, 1]}, [], [2.0, 0.5], [], ("reference",))
    # The reference does not read a negative axis (its transpose fails); onnxruntime does.
    _compare(x, {"mode": "linear", "axes": [2, -1]}, [], [], [11, 8], ("onnxruntime",))


def test_a_segmentation_heads_upsampling_runs_in_numpy(tmp_path: Path) -> None:
    """LRASPP's and DeepLab's last step, a bilinear upsampling of the class scores to the
    image (sizes from a Shape of the image, folded at a static shape), runs as numpy's
    Resize, not the reference's, and matches onnxruntime."""
    pytest.importorskip("onnxruntime")
    from onnx_support import compile_and_compare

    sizes = numpy_helper.from_array(np.array([1, 21, 64, 64], np.int64), "sizes")
    graph = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear",
                          coordinate_transformation_mode="pytorch_half_pixel")],
        "upsample", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 21, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 21, 64, 64])], [sizes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    compiled = compile_and_compare(model, tmp_path)
    assert [(o["op"], o["engine"]) for o in compiled.outside_kernels()] == [("Resize", "numpy")]


@pytest.mark.parametrize(("mode", "scales", "out"), [
    ("linear", [1, 1, 2, 1.5], [1, 2, 8, 9]), ("nearest", [1, 1, 2, 1.5], [1, 2, 8, 9]),
    ("nearest", [1, 1, 0.5, 0.5], [1, 2, 2, 3])], ids=["linear", "nearest-up", "nearest-down"])
def test_opset_10_resize_reads_its_scales_as_onnxruntime_does(
        mode: str, scales: list[float], out: list[int], tmp_path: Path) -> None:
    """Opset 10's Resize (``X, scales``, no coordinate modes: asymmetric), which the
    reference implementation cannot run, matches onnxruntime."""
    pytest.importorskip("onnxruntime")
    from onnx_support import compile_and_compare

    factors = numpy_helper.from_array(np.array(scales, np.float32), "scales")
    graph = helper.make_graph(
        [helper.make_node("Resize", ["x", "scales"], ["y"], mode=mode)], "resize10",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], [factors])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)], ir_version=5)
    compile_and_compare(model, tmp_path)
