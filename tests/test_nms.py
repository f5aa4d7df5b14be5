"""NonMaxSuppression in numpy selects exactly what onnx's reference implementation selects
(and onnxruntime), on random boxes with overlaps, ties, flipped corners, both box
encodings, score thresholds and output limits; and torchvision's batched form (one class,
classes kept apart by a coordinate offset) stays fast."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tunecache.compiler.onnx_ops import implementation


def _model(center_point_box: int, with_threshold: bool) -> onnx.ModelProto:
    names = ["boxes", "scores", "limit", "iou"] + (["floor"] if with_threshold else [])
    inputs = [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, None),
              helper.make_tensor_value_info("scores", TensorProto.FLOAT, None),
              helper.make_tensor_value_info("limit", TensorProto.INT64, [1]),
              helper.make_tensor_value_info("iou", TensorProto.FLOAT, [1])]
    if with_threshold:
        inputs.append(helper.make_tensor_value_info("floor", TensorProto.FLOAT, [1]))
    graph = helper.make_graph(
        [helper.make_node("NonMaxSuppression", names, ["selected"],
                          center_point_box=center_point_box)], "nms", inputs,
        [helper.make_tensor_value_info("selected", TensorProto.INT64, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)


def _case(seed: int, center_point_box: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    batches, classes, count = 2, 3, 60
    centres = rng.uniform(0, 10, (batches, count, 2)).astype(np.float32)
    sizes = rng.uniform(0.5, 4, (batches, count, 2)).astype(np.float32)
    if center_point_box:
        boxes = np.concatenate([centres, sizes], axis=2)
    else:  # [y1, x1, y2, x2], some with their corners flipped
        low, high = centres - sizes / 2, centres + sizes / 2
        boxes = np.stack([low[..., 1], low[..., 0], high[..., 1], high[..., 0]], axis=2)
        flip = rng.random((batches, count)) < 0.3
        boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
    boxes[:, 5] = boxes[:, 4]  # a duplicate box
    scores = rng.choice(np.linspace(0, 1, 25, dtype=np.float32), (batches, classes, count))
    return boxes, scores  # scores drawn from 25 values: many ties


@pytest.mark.parametrize("center_point_box", [0, 1])
@pytest.mark.parametrize(("limit", "iou", "floor"), [
    (100, 0.5, None), (4, 0.3, 0.4), (100, 0.0, 0.2), (0, 0.5, None)])
def test_matches_the_reference_implementation(center_point_box: int, limit: int, iou: float,
                                              floor: float | None) -> None:
    model = _model(center_point_box, floor is not None)
    reference = ReferenceEvaluator(model)
    nms = implementation("NonMaxSuppression")
    assert nms is not None
    for seed in range(3):
        boxes, scores = _case(seed, center_point_box)
        feeds = {"boxes": boxes, "scores": scores, "limit": np.array([limit], np.int64),
                 "iou": np.array([iou], np.float32)}
        if floor is not None:
            feeds["floor"] = np.array([floor], np.float32)
        [expected] = reference.run(None, feeds)
        [ours] = nms(list(feeds.values()), {"center_point_box": center_point_box}, 11)
        assert ours.dtype == np.int64 and ours.shape[1:] == (3,)
        np.testing.assert_array_equal(ours, np.asarray(expected).reshape(-1, 3))


def test_matches_onnxruntime_on_torchvisions_batched_form() -> None:
    """Thousands of boxes in one class, 91 groups offset apart (torchvision's batched_nms):
    the same selection as onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(7)
    groups, per = 91, 60
    centres = rng.uniform(0, 300, (groups * per, 2)).astype(np.float32)
    sizes = rng.uniform(5, 80, (groups * per, 2)).astype(np.float32)
    offset = (np.repeat(np.arange(groups), per) * 400).astype(np.float32)[:, None]
    low, high = centres - sizes / 2 + offset, centres + sizes / 2 + offset
    boxes = np.concatenate([low, high], axis=1)[None]
    scores = rng.random((1, 1, groups * per)).astype(np.float32)
    feeds = {"boxes": boxes, "scores": scores, "limit": np.array([100000], np.int64),
             "iou": np.array([0.5], np.float32)}
    session = ort.InferenceSession(_model(0, False).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    [expected] = session.run(None, feeds)
    nms = implementation("NonMaxSuppression")
    assert nms is not None
    [ours] = nms(list(feeds.values()), {}, 11)
    np.testing.assert_array_equal(ours, expected)


def test_runs_in_numpy_inside_an_if_branch(tmp_path: Path) -> None:
    """torchvision's batched_nms exports NonMaxSuppression inside an If (``boxes.numel() ==
    0``) that the reference implementation evaluates: the branch runs our numpy NMS (its
    evaluator is given it) and the model matches onnxruntime."""
    pytest.importorskip("onnxruntime")
    from onnx_support import ort_run

    from tunecache.cache.store import Store
    from tunecache.compiler.onnx_ops.reference import _numpy_classes
    from tunecache.tuner.deploy import compile_model

    assert "NonMaxSuppression" in {c.__name__ for c in _numpy_classes(11)}
    limit = helper.make_tensor("limit", TensorProto.INT64, [1], [50])
    iou = helper.make_tensor("iou", TensorProto.FLOAT, [1], [0.5])
    then = helper.make_graph(
        [helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou"], ["kept"])],
        "then", [], [helper.make_tensor_value_info("kept", TensorProto.INT64, None)])
    empty = helper.make_graph(
        [helper.make_node("Constant", [], ["none"], value=helper.make_tensor(
            "none", TensorProto.INT64, [0, 3], []))],
        "else", [], [helper.make_tensor_value_info("none", TensorProto.INT64, None)])
    graph = helper.make_graph(
        [helper.make_node("ReduceMax", ["scores"], ["best"], keepdims=0),
         helper.make_node("Constant", [], ["zero"], value=helper.make_tensor(
             "zero", TensorProto.FLOAT, [], [0.0])),
         helper.make_node("Greater", ["best", "zero"], ["any"]),  # known at run time only
         helper.make_node("If", ["any"], ["selected"], then_branch=then, else_branch=empty)],
        "batched", [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 60, 4]),
                    helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 3, 60])],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, None)], [limit, iou])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    boxes, scores = _case(3, 0)
    feeds = {"boxes": boxes[:1], "scores": scores[:1]}
    compiled = compile_model(path, store=Store(tmp_path / "s"), policy="analytic")
    assert [n.op_type for n in compiled.graph.onnx_nodes][-1] == "If"
    np.testing.assert_array_equal(compiled.run(feeds)["selected"], ort_run(model, feeds)[0])


def test_clusters_too_large_for_one_matrix_select_the_same(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """A cluster over the matrix limit compares each kept box with the members after it
    instead: the same selection as the reference's."""
    from tunecache.compiler.onnx_ops import detection

    monkeypatch.setattr(detection, "_MATRIX_LIMIT", 4)
    model = _model(0, True)
    nms = implementation("NonMaxSuppression")
    assert nms is not None
    boxes, scores = _case(5, 0)
    feeds = {"boxes": boxes, "scores": scores, "limit": np.array([30], np.int64),
             "iou": np.array([0.4], np.float32), "floor": np.array([0.1], np.float32)}
    [expected] = ReferenceEvaluator(model).run(None, feeds)
    [ours] = nms(list(feeds.values()), {}, 11)
    np.testing.assert_array_equal(ours, np.asarray(expected).reshape(-1, 3))
