"""Detection post-processing in numpy: ``NonMaxSuppression``.

onnx's reference implementation compares boxes one pair at a time in Python: torchvision's
SSDlite (27,300 candidate boxes in one class, its classes kept apart by a coordinate offset)
ran it for minutes. Here each class's candidates split into clusters of boxes whose x
extents overlap (boxes in different clusters cannot suppress each other), and greedy
suppression runs per cluster with each selected box compared against all later candidates
at once. The result is the reference's exactly: candidates in descending score (ties by
lower index), a candidate suppressed when its IoU with a selected box, computed in the
boxes' float type in the reference's order, exceeds the threshold; scores above
``score_threshold`` only; at most ``max_output_boxes_per_class`` per class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tunecache.compiler.onnx_ops.registry import Array, opt_input, register


@register("NonMaxSuppression", in_subgraphs=True)
def _non_max_suppression(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
                         opset: int) -> list[Array]:
    boxes, scores = inputs[0], inputs[1]
    assert boxes is not None and scores is not None
    limit = _scalar(opt_input(inputs, 2), 0)
    iou = _scalar(opt_input(inputs, 3), 0.0)
    floor = opt_input(inputs, 4)
    threshold = None if floor is None or floor.size == 0 else floor.reshape(-1)[0]
    selected: list[Array] = []
    for b in range(boxes.shape[0]):
        extents = _extents(boxes[b], int(attrs.get("center_point_box", 0)))
        for c in range(scores.shape[1]):
            kept = _class_nms(extents, scores[b, c], iou, threshold, max(int(limit), 0))
            selected.append(np.stack([np.full_like(kept, b), np.full_like(kept, c), kept], 1))
    if not selected:
        return [np.empty((0, 3), np.int64)]
    return [np.concatenate(selected).astype(np.int64)]


def _scalar(value: Array | None, default: Any) -> Any:
    return default if value is None or value.size == 0 else value.reshape(-1)[0]


def _extents(boxes: Array, center_point_box: int) -> tuple[Array, Array, Array, Array]:
    """``(x_min, x_max, y_min, y_max)`` of each box in the boxes' float type: corners
    ``[y1, x1, y2, x2]`` in either order, or ``[x_center, y_center, width, height]``."""
    if center_point_box:
        half_w, half_h = boxes[:, 2] / 2, boxes[:, 3] / 2
        return (boxes[:, 0] - half_w, boxes[:, 0] + half_w, boxes[:, 1] - half_h,
                boxes[:, 1] + half_h)
    return (np.minimum(boxes[:, 1], boxes[:, 3]), np.maximum(boxes[:, 1], boxes[:, 3]),
            np.minimum(boxes[:, 0], boxes[:, 2]), np.maximum(boxes[:, 0], boxes[:, 2]))


def _class_nms(extents: tuple[Array, ...], scores: Array, iou: Any, threshold: Any,
               limit: int) -> Array:
    """The box indices one class keeps, in the order they are selected."""
    candidates = np.arange(scores.shape[0])
    if threshold is not None:
        candidates = candidates[scores > threshold]
    if limit == 0 or candidates.size == 0:
        return np.empty(0, np.int64)
    order = candidates[np.lexsort((candidates, -scores[candidates]))]
    kept = np.concatenate([_greedy(extents, members, iou, limit)
                           for members in _x_clusters(extents, order)])
    rank = np.empty(scores.shape[0], np.int64)
    rank[order] = np.arange(order.size)
    return kept[np.argsort(rank[kept], kind="stable")][:limit]


def _x_clusters(extents: tuple[Array, ...], order: Array) -> list[Array]:
    """``order`` (score order) split into groups whose x extents chain into one another; a
    box in one group shares no x interval with a box in another, so cannot suppress it."""
    x_min, x_max = extents[0][order], extents[1][order]
    by_x = np.argsort(x_min, kind="stable")
    reach = np.maximum.accumulate(x_max[by_x])
    starts = np.zeros(order.size, np.int64)
    starts[1:] = x_min[by_x][1:] >= reach[:-1]
    label = np.empty(order.size, np.int64)
    label[by_x] = np.cumsum(starts)
    groups = np.argsort(label, kind="stable")  # stable: each group keeps the score order
    bounds = np.flatnonzero(np.diff(label[groups])) + 1
    return [order[g] for g in np.split(groups, bounds)]


def _greedy(extents: tuple[Array, ...], members: Array, iou: Any, limit: int) -> Array:
    """Greedy suppression over ``members`` (score order): each box not yet suppressed is
    kept and suppresses every later member it overlaps by more than ``iou``."""
    x0, x1, y0, y1 = (e[members] for e in extents)
    area = (x1 - x0) * (y1 - y0)
    alive = np.ones(members.size, np.bool_)
    kept: list[int] = []
    for i in range(members.size):
        if not alive[i]:
            continue
        kept.append(i)
        if len(kept) == limit:
            break
        rest = slice(i + 1, None)
        width = np.minimum(x1[i], x1[rest]) - np.maximum(x0[i], x0[rest])
        height = np.minimum(y1[i], y1[rest]) - np.maximum(y0[i], y0[rest])
        inter = width * height
        union = area[i] + area[rest] - inter
        with np.errstate(divide="ignore", invalid="ignore"):
            over = (width > 0) & (height > 0) & (inter > 0) & (area[i] > 0) & \
                (area[rest] > 0) & (union > 0) & (inter / union > iou)
        alive[rest] &= ~over
    return members[np.asarray(kept, np.int64)]
