"""Ranking metrics within one group (one op on one hardware) and their summaries.

Every function takes ``scores`` (higher = predicted faster) and ``labels`` (measured speed
normalised within the group: ``best_median / median``, 1.0 for the fastest, 0.0 for a failed
candidate). Ties in ``scores`` are broken by position, so results are deterministic.
Rank correlation comes from scipy and NDCG from scikit-learn; the top-k score and the
search-efficiency counts are this project's own measures (no library has them).
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

REACH = 0.95
"""Search efficiency counts measurements until one reaches this fraction of the best."""


def order(scores: np.ndarray) -> np.ndarray:
    """Indices best score first; NaN scores last; ties keep their original order."""
    s = np.where(np.isnan(scores), -np.inf, scores.astype(np.float64))
    return np.argsort(-s, kind="stable")


def topk_score(scores: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Best measured among the top-``k`` by score ÷ best measured (labels are that ratio)."""
    return float(labels[order(scores)[:k]].max())


def pairwise_accuracy(scores: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of pairs with different labels that the scores order the same way.

    Pairs with equal scores count half. NaN when every label is equal.
    """
    s = np.where(np.isnan(scores), -np.inf, scores.astype(np.float64))
    dl = labels[:, None] - labels[None, :]
    ds = s[:, None] - s[None, :]
    mask = dl > 0
    pairs = int(mask.sum())
    if pairs == 0:
        return float("nan")
    agree = (ds[mask] > 0).sum() + 0.5 * (ds[mask] == 0).sum()
    return float(agree / pairs)


def _finite(scores: np.ndarray) -> np.ndarray:
    """Scores with NaN (no prediction) ranked below every real score."""
    s = scores.astype(np.float64)
    floor = np.nanmin(s) - 1.0 if not np.isnan(s).all() else 0.0
    return np.where(np.isnan(s), floor, s)


def spearman(scores: np.ndarray, labels: np.ndarray) -> float:
    """Spearman rank correlation (scipy; average ranks for ties); NaN if either side is
    constant."""
    from scipy.stats import spearmanr

    s = _finite(scores)
    if np.ptp(s) == 0 or np.ptp(labels) == 0:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(spearmanr(s, labels).statistic)


def ndcg(scores: np.ndarray, labels: np.ndarray) -> float:
    """Normalised discounted cumulative gain of the score order, the labels as gains
    (scikit-learn's ``ndcg_score``); 1.0 when the order is ideal. NaN for a single row."""
    from sklearn.metrics import ndcg_score  # imported on use: deploys never evaluate

    if len(labels) < 2:
        return float("nan")
    return float(ndcg_score(labels[None, :], _finite(scores)[None, :]))


def measurements_to_reach(scores: np.ndarray, labels: np.ndarray, reach: float = REACH) -> int:
    """How many candidates, measured in score order, until one is within ``reach`` of the best."""
    hits = np.flatnonzero(labels[order(scores)] >= reach)
    return int(hits[0]) + 1


def random_measurements_to_reach(labels: np.ndarray, reach: float = REACH) -> float:
    """Expected measurements in a uniformly random order: ``(n + 1) / (good + 1)``.

    The exact mean over all orders (what averaging over random seeds converges to).
    """
    good = int((labels >= reach).sum())
    return (len(labels) + 1) / (good + 1)


@dataclass(frozen=True, slots=True)
class RankingMetrics:
    """Ranking quality over groups: means (and the worst group for the top-k scores)."""

    groups: int
    top1: float
    top5: float
    pairwise: float
    spearman: float
    ndcg: float
    top1_worst: float
    top5_worst: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class SearchEfficiency:
    """Mean measurements until one reaches ``reach`` of the best, per ordering."""

    reach: float
    model: float
    analytic: float
    random: float

    @property
    def vs_random(self) -> float:
        """How many times fewer measurements the model needs than a random order."""
        return self.random / self.model if self.model else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "vs_random": self.vs_random}


def group_metrics(scores: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Every per-group figure for one score vector."""
    return {
        "top1": topk_score(scores, labels, 1),
        "top5": topk_score(scores, labels, 5),
        "pairwise": pairwise_accuracy(scores, labels),
        "spearman": spearman(scores, labels),
        "ndcg": ndcg(scores, labels),
        "to_reach": float(measurements_to_reach(scores, labels)),
    }


def summarise(per_group: pd.DataFrame, prefix: str) -> RankingMetrics:
    """Summarise the ``<prefix>_top1`` … columns of a per-group table.

    Groups without a value (the analytic estimate of an op kind it does not cover) are left
    out, and ``groups`` counts the rest.
    """
    def col(name: str) -> pd.Series:
        return per_group[f"{prefix}_{name}"].astype(float)

    return RankingMetrics(
        groups=int(col("top1").notna().sum()),
        top1=float(col("top1").mean()),
        top5=float(col("top5").mean()),
        pairwise=float(col("pairwise").mean()),
        spearman=float(col("spearman").mean()),
        ndcg=float(col("ndcg").mean()),
        top1_worst=float(col("top1").min()),
        top5_worst=float(col("top5").min()),
    )
