"""Detection ops in numpy: ``NonMaxSuppression`` and ``RoiAlign``.

onnx's reference implementation compares boxes one pair at a time in Python: torchvision's
SSDlite (27,300 candidate boxes in one class, its classes kept apart by a coordinate offset)
ran it for minutes. Here each class's candidates split into clusters of boxes whose x
extents overlap (boxes in different clusters cannot suppress each other), and greedy
suppression runs per cluster over a matrix of which pairs overlap, computed at once. The
result is the reference's exactly: candidates in descending score (ties by lower index),
a candidate suppressed when its IoU with a selected box, computed in the boxes' float
type in the reference's order, exceeds the threshold; scores above ``score_threshold``
only; at most
``max_output_boxes_per_class`` per class.

``RoiAlign`` (Faster/Mask R-CNN's box heads: a thousand regions a run) samples each region
as separable bilinear weights: averaged, one region's bins are two small matrix products
over the window it reads (``rows @ X @ cols``); the ``max`` mode takes, per sample, the
largest weighted corner, as onnxruntime and the reference do.
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
    kept and suppresses every later member it overlaps by more than ``iou``. A cluster of
    up to :data:`_MATRIX_LIMIT` boxes compares all pairs at once; a larger one compares
    each kept box with the members after it."""
    x0, x1, y0, y1 = (e[members] for e in extents)
    box = (x0, x1, y0, y1, (x1 - x0) * (y1 - y0))
    alive = np.ones(members.size, np.bool_)
    whole = members.size <= _MATRIX_LIMIT
    over = _suppresses(box, slice(None), slice(None), iou) if whole else None
    kept: list[int] = []
    for i in range(members.size):
        if not alive[i]:
            continue
        kept.append(i)
        if len(kept) == limit:
            break
        if over is not None:
            alive &= ~over[i]  # earlier members are decided already
        else:
            alive[i + 1:] &= ~_suppresses(box, slice(i, i + 1), slice(i + 1, None), iou)[0]
    return members[np.asarray(kept, np.int64)]


_MATRIX_LIMIT = 2048
"""The largest cluster whose pairs are compared as one matrix (16 MiB of float32)."""


def _suppresses(box: tuple[Array, ...], rows: slice, cols: slice, iou: Any) -> Array:
    """``[rows, cols]``: whether each pair of ``box`` (``x0, x1, y0, y1, area``) overlaps
    by more than ``iou``, computed as the reference does (a zero-area box or overlap
    suppresses nothing)."""
    x0, x1, y0, y1, area = box
    width = np.minimum(x1[rows, None], x1[None, cols]) - np.maximum(x0[rows, None],
                                                                    x0[None, cols])
    height = np.minimum(y1[rows, None], y1[None, cols]) - np.maximum(y0[rows, None],
                                                                     y0[None, cols])
    inter = width * height
    union = area[rows, None] + area[None, cols] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return (width > 0) & (height > 0) & (inter > 0) & (area[rows, None] > 0) & \
            (area[None, cols] > 0) & (union > 0) & (inter / union > iou)


@register("RoiAlign", in_subgraphs=True)
def _roi_align(inputs: Sequence[Array | None], attrs: Mapping[str, Any],
               opset: int) -> list[Array]:
    x, rois, batch = inputs[0], inputs[1], inputs[2]
    assert x is not None and rois is not None and batch is not None
    default_mode = "half_pixel" if opset >= 16 else "output_half_pixel"
    half_pixel = str(attrs.get("coordinate_transformation_mode", default_mode)) == "half_pixel"
    size = (int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1)))
    ratio = int(attrs.get("sampling_ratio", 0))
    scale = float(attrs.get("spatial_scale", 1.0))
    average = str(attrs.get("mode", "avg")) == "avg"
    out = np.zeros((rois.shape[0], x.shape[1], *size), x.dtype)
    for n in range(rois.shape[0]):
        start = rois[n, :2].astype(np.float64) * scale - (0.5 if half_pixel else 0.0)
        extent = rois[n, 2:4].astype(np.float64) * scale - (0.5 if half_pixel else 0.0) - start
        if not half_pixel:
            extent = np.maximum(extent, 1.0)
        # (y, x): the roi is (x1, y1, x2, y2)
        axes = [_sample_weights(float(start[a]), float(extent[a]), size[k], ratio,
                                x.shape[2 + k]) for k, a in ((0, 1), (1, 0))]
        image = x[int(batch[n])]
        out[n] = _pooled(image, axes, average, size)
    return [out]


def _sample_weights(start: float, extent: float, bins: int, ratio: int,
                    length: int) -> tuple[Array, int, int]:
    """One axis of a region's samples: ``(weights [bins * grid, window], first, grid)``,
    each sample's two bilinear weights over the ``window`` of input positions from
    ``first`` (zero for a sample off the input)."""
    grid = ratio if ratio > 0 else max(int(np.ceil(extent / bins)), 0)
    if grid == 0:  # an empty region samples nothing: its bins are zero
        return np.zeros((bins, 1)), 0, 0
    step = extent / bins
    k = np.arange(bins * grid)
    at = start + (k // grid) * step + ((k % grid) + 0.5) * step / grid
    off = (at < -1.0) | (at > length)
    at = np.maximum(at, 0.0)
    low = at.astype(np.int64)
    edge = low >= length - 1
    low = np.where(edge, length - 1, low)
    high = np.where(edge, low, low + 1)
    frac = np.where(edge, 0.0, at - low)
    first = int(low[~off].min()) if (~off).any() else 0
    window = int(high[~off].max()) + 1 - first if (~off).any() else 1
    weights = np.zeros((k.size, window))
    rows = np.flatnonzero(~off)
    np.add.at(weights, (rows, low[rows] - first), 1.0 - frac[rows])
    np.add.at(weights, (rows, high[rows] - first), frac[rows])
    return weights, first, grid


def _pooled(image: Array, axes: list[tuple[Array, int, int]], average: bool,
            size: tuple[int, int]) -> Array:
    """One region's ``[C, bins_h, bins_w]`` from its two axes' sample weights."""
    (wy, y0, gy), (wx, x0, gx) = axes
    window = image[:, y0:y0 + wy.shape[1], x0:x0 + wx.shape[1]].astype(np.float64)
    if average:
        rows = wy.reshape(size[0], max(gy, 1), -1).sum(1)
        cols = wx.reshape(size[1], max(gx, 1), -1).sum(1)
        return (rows @ window @ cols.T) / max(gy * gx, 1)
    return _max_pooled(window, wy, wx, size, (max(gy, 1), max(gx, 1)))


def _max_pooled(window: Array, wy: Array, wx: Array, size: tuple[int, int],
                grid: tuple[int, int]) -> Array:
    """The ``max`` mode: each sample's largest weighted corner, the largest per bin."""
    ly, lx = np.argmax(wy > 0, axis=1), np.argmax(wx > 0, axis=1)
    hy = np.minimum(ly + 1, wy.shape[1] - 1)
    hx = np.minimum(lx + 1, wx.shape[1] - 1)
    ry, rx = np.arange(wy.shape[0]), np.arange(wx.shape[0])
    best = None
    for yi, y_w in ((ly, wy[ry, ly]), (hy, np.where(hy > ly, wy[ry, hy], 0.0))):
        for xi, x_w in ((lx, wx[rx, lx]), (hx, np.where(hx > lx, wx[rx, hx], 0.0))):
            v = window[:, yi][:, :, xi] * (y_w[:, None] * x_w[None, :])
            best = v if best is None else np.maximum(best, v)
    assert best is not None
    c = window.shape[0]
    return best.reshape(c, size[0], grid[0], size[1], grid[1]).max(axis=(2, 4))
