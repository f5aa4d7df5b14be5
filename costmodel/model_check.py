"""Structural checks of an XGBoost JSON model, before XGBoost reads it.

XGBoost trusts the trees it loads: a child index out of range, a node that is its own
child or one of -5 made ``predict`` die with SIGSEGV (issue 55), and a cost model comes from
a shared store. :func:`model_problems` checks what ``predict`` walks: every tree of a
``gbtree`` booster has ``num_nodes`` entries in each per-node array, each node is a leaf
(both children -1) or splits on a feature the model has into two later nodes, every node
but the root is some node's child exactly once (a tree, no cycles), and no split is
categorical (tunecache trains none). The model's meta (:mod:`tunecache.costmodel.model`)
guards the rest: feature layout, hash, versions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["model_problems"]

NODE_ARRAYS = ("left_children", "right_children", "parents", "split_indices",
               "split_conditions", "split_type", "default_left", "base_weights",
               "loss_changes", "sum_hessian")


def model_problems(data: Any, num_features: int) -> list[str]:
    """Why the parsed ``model.json`` ``data`` is not a ``gbtree`` model XGBoost can walk
    safely over ``num_features`` features (empty: it is)."""
    try:
        booster = data["learner"]["gradient_booster"]
        trees = booster["model"]["trees"]
        declared = int(booster["model"]["gbtree_model_param"]["num_trees"])
    except (KeyError, TypeError, ValueError):
        return ["not an XGBoost gbtree model (learner.gradient_booster.model.trees)"]
    if booster.get("name") != "gbtree" or not isinstance(trees, list):
        return ["not an XGBoost gbtree model"]
    if declared != len(trees) or len(booster["model"].get("tree_info", ())) != len(trees):
        return [f"declares {declared} trees and holds {len(trees)}"]
    for i, tree in enumerate(trees):
        found = _tree_problems(tree, num_features) if isinstance(tree, Mapping) else [
            "not an object"]
        if found:
            return [f"tree {i}: {found[0]}"]
    return []


def _tree_problems(tree: Mapping[str, Any], num_features: int) -> list[str]:
    try:
        n = int(tree["tree_param"]["num_nodes"])
    except (KeyError, TypeError, ValueError):
        return ["no tree_param.num_nodes"]
    if n < 1:
        return [f"{n} nodes"]
    for name in NODE_ARRAYS:
        if not isinstance(tree.get(name), list) or len(tree[name]) != n:
            return [f"{name} does not hold {n} entries"]
    if tree.get("categories_nodes"):
        return ["categorical splits (tunecache trains none)"]
    return _node_problems(tree, n, num_features)


def _node_problems(tree: Mapping[str, Any], n: int, num_features: int) -> list[str]:
    left, right, feature = tree["left_children"], tree["right_children"], tree["split_indices"]
    children = [0] * n
    for j in range(n):
        a, b = left[j], right[j]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (a, b, feature[j])):
            return [f"node {j}: indices are not integers"]
        if (a, b) == (-1, -1):
            continue
        if not (j < a < n and j < b < n and a != b):
            return [f"node {j}: children {a}, {b} are not two later nodes of {n}"]
        if not 0 <= feature[j] < num_features or tree["split_type"][j] != 0:
            return [f"node {j}: splits on feature {feature[j]} of {num_features}"]
        children[a] += 1
        children[b] += 1
    if children[0] or any(count != 1 for count in children[1:]):
        return ["a node is the child of none or of several nodes"]
    return []
