"""RoiAlign, ScatterElements and ScatterND in numpy (the reference implementation's are
per-element Python: a Faster R-CNN spent 10 s a run in them) against onnx's reference and
onnxruntime, over random regions (empty, partly off the map, every sampling ratio, both
coordinate modes, both pooling modes) and random scatters (every reduction, negative and
repeated indices)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tunecache.compiler.onnx_ops import implementation


def _one_node(op: str, inputs: list[tuple[str, int]], opset: int,
              **attrs: Any) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node(op, [n for n, _ in inputs], ["y"], **attrs)], op,
        [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ours(op: str, values: list[np.ndarray], attrs: dict[str, Any], opset: int) -> np.ndarray:
    impl = implementation(op)
    assert impl is not None
    return impl(values, attrs, opset)[0]


def _roi_case(rng: np.random.Generator) -> list[np.ndarray]:
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    rois = rng.uniform(-4, 24, (7, 4)).astype(np.float32)
    empty = rng.choice([0, 1], (7, 1))  # some regions of size zero
    rois[:, 2:] = rois[:, :2] + np.abs(rois[:, 2:] - rois[:, :2]) * empty
    return [x, rois, rng.integers(0, 2, 7).astype(np.int64)]


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("coordinates", ["half_pixel", "output_half_pixel"])
def test_roi_align_matches_the_reference_and_onnxruntime(mode: str, coordinates: str) -> None:
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(len(mode) + len(coordinates))
    for _ in range(8):
        attrs = {"output_height": int(rng.integers(1, 5)), "output_width": int(rng.integers(1, 5)),
                 "sampling_ratio": int(rng.integers(0, 3)), "mode": mode,
                 "spatial_scale": float(rng.choice([1.0, 0.5, 0.25])),
                 "coordinate_transformation_mode": coordinates}
        values = _roi_case(rng)
        model = _one_node("RoiAlign", [("x", 1), ("r", 1), ("b", 7)], 16, **attrs)
        feeds = dict(zip("xrb", values, strict=True))
        ours = _ours("RoiAlign", values, attrs, 16)
        [reference] = ReferenceEvaluator(model).run(None, feeds)
        np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-5)
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(ours, session.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_roi_align_before_opset_16_has_no_half_pixel_offset() -> None:
    """Opset 10's RoiAlign has no coordinate mode: onnxruntime reads it as
    ``output_half_pixel`` (regions at least one pixel), and so do we."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(10)
    values = _roi_case(rng)
    attrs = {"output_height": 3, "output_width": 2, "sampling_ratio": 0, "spatial_scale": 0.5}
    model = _one_node("RoiAlign", [("x", 1), ("r", 1), ("b", 7)], 10, **attrs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, dict(zip("xrb", values, strict=True)))[0]
    np.testing.assert_allclose(_ours("RoiAlign", values, attrs, 10), expected, rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements_matches_the_reference(reduction: str, axis: int) -> None:
    rng = np.random.default_rng(axis + 3)
    data = rng.standard_normal((4, 5, 6)).astype(np.float32)
    shape = [3, 4, 5]
    length = data.shape[axis]
    # Without a reduction ONNX leaves repeated indices undefined: each index once there.
    picks = np.stack([rng.permutation(length)[:shape[axis]] for _ in range(
        int(np.prod(shape)) // shape[axis])])
    idx = np.moveaxis(picks.reshape([s for k, s in enumerate(shape) if k != axis % 3]
                                    + [shape[axis]]), -1, axis) if reduction == "none" \
        else rng.integers(-length, length, shape)
    updates = rng.standard_normal(shape).astype(np.float32)
    attrs = {"axis": axis} | ({} if reduction == "none" else {"reduction": reduction})
    model = _one_node("ScatterElements", [("d", 1), ("i", 7), ("u", 1)], 18, **attrs)
    values = [data, idx.astype(np.int64), updates]
    [reference] = ReferenceEvaluator(model).run(None, dict(zip("diu", values, strict=True)))
    np.testing.assert_allclose(_ours("ScatterElements", values, attrs, 18), reference,
                               rtol=1e-6)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_matches_the_reference(reduction: str) -> None:
    rng = np.random.default_rng(5)
    data = rng.standard_normal((5, 4, 3)).astype(np.float32)
    cells = [(a, b) for a in range(-5, 5) for b in range(4)]
    # Without a reduction each cell once (ONNX leaves repeats undefined); with one, repeats.
    chosen = rng.choice(len(cells), 6, replace=reduction != "none")
    idx = np.array([cells[c] for c in chosen], np.int64).reshape(2, 3, 2)
    updates = rng.standard_normal((2, 3, 3)).astype(np.float32)
    attrs = {} if reduction == "none" else {"reduction": reduction}
    model = _one_node("ScatterND", [("d", 1), ("i", 7), ("u", 1)], 18, **attrs)
    values = [data, idx, updates]
    [reference] = ReferenceEvaluator(model).run(None, dict(zip("diu", values, strict=True)))
    np.testing.assert_allclose(_ours("ScatterND", values, attrs, 18), reference, rtol=1e-6)
