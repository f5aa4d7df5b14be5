"""The learned cost model: XGBoost ranking over the feature vector, trained from measurements.

Training data are store rows (``op_text``, ``op_id``, ``hw_id``, ``hw_json``,
``schedule_json``, ``status``, ``median_s``). They are grouped by (op, hardware): one group
is one ranking problem. Repeated measurements of a schedule are aggregated by the median of
their ``ok`` medians (like publishing); a schedule never measured ``ok`` is a failure. Labels
are normalised within the group — ``best_median / median`` (1.0 for the fastest), 0.0 for
failures — so operators of any size weigh the same and failures rank last. Groups without
an ``ok`` row or with fewer than two schedules teach no order and are dropped.

The model scores candidates (higher = predicted faster); only the order within one op on one
machine is meaningful. It is saved as XGBoost's own JSON (``model.json``) plus ``meta.json``
(feature version and names, training-data fingerprint, row and group counts, metrics,
library versions, creation time, version id and the model file's hash) — never pickled.
Loading checks all of that and refuses a model built for another feature layout.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.files import read_regular
from tunecache.compiler.hardware import HardwareSpec
from tunecache.compiler.ops import OpSignature
from tunecache.compiler.schedule import Schedule
from tunecache.costmodel import features as F
from tunecache.costmodel import metrics as M
from tunecache.costmodel.model_check import model_problems

META_FORMAT = 1
MODEL_FILE = "model.json"
META_FILE = "meta.json"
MAX_MODEL_FILE_BYTES = 256 << 20
"""The largest model or meta file read (the shipped model is about 1 MB)."""
REQUIRED_COLUMNS = ("op_text", "op_id", "hw_id", "hw_json", "schedule_json", "status", "median_s")
_EST = F.FEATURE_NAMES.index("est_log_s")


class CostModelError(TunecacheError):
    """Training data or a saved model that cannot be used."""


class ModelLoadError(CostModelError):
    """A saved model is missing, damaged or inconsistent."""


class FeatureVersionError(ModelLoadError):
    """A saved model was trained on another feature layout than this code computes."""


# -- training data --------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingSet:
    """Featurised, labelled groups, rows sorted by group (what XGBoost ranking needs).

    ``rows`` has one row per (hardware, op, schedule) with ``group`` (index into ``groups``),
    ``hw_id``, ``op_id``, ``op_text``, ``schedule_json``, ``median_s`` (NaN for failures)
    and ``label``; ``groups`` one row per group with ``hw_id``, ``op_id``, ``op_text``,
    ``size``. ``dropped`` counts rows left out and why.
    """

    X: np.ndarray
    rows: pd.DataFrame
    groups: pd.DataFrame
    fingerprint: str
    dropped: dict[str, int]
    source_rows: int

    @property
    def labels(self) -> np.ndarray:
        return self.rows["label"].to_numpy(dtype=np.float64)

    @property
    def group(self) -> np.ndarray:
        return self.rows["group"].to_numpy(dtype=np.int64)

    def subset(self, group_mask: np.ndarray) -> TrainingSet:
        """The groups where ``group_mask`` is true (re-indexed, order kept)."""
        keep_groups = np.flatnonzero(group_mask)
        new_index = np.full(len(self.groups), -1)
        new_index[keep_groups] = np.arange(len(keep_groups))
        row_mask = group_mask[self.group]
        rows = self.rows.loc[row_mask].copy()
        rows["group"] = new_index[rows["group"].to_numpy()]
        return replace(self, X=self.X[row_mask], rows=rows.reset_index(drop=True),
                       groups=self.groups.iloc[keep_groups].reset_index(drop=True))


def _float_column(series: pd.Series) -> np.ndarray:
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def prepare(df: pd.DataFrame) -> TrainingSet:
    """Aggregate, label and featurise store rows (see the module docstring)."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise CostModelError(
            f"training data lacks column(s) {', '.join(missing)}; expected store records "
            f"(tunecache.datasets.load) with {', '.join(REQUIRED_COLUMNS)}"
        )
    dropped: dict[str, int] = {}
    frame = pd.DataFrame({c: df[c].astype(object) for c in REQUIRED_COLUMNS if c != "median_s"})
    median = _float_column(df["median_s"])
    ok = (frame["status"] == "ok").to_numpy(dtype=bool) & np.isfinite(median) & (median > 0)
    frame["m"] = pd.Series(np.where(ok, median, np.nan), index=frame.index)
    no_schedule = frame["schedule_json"].isna().to_numpy()
    if no_schedule.any():
        dropped["records without a schedule"] = int(no_schedule.sum())
        frame = frame.loc[~no_schedule]
    if frame.empty:
        raise CostModelError("no training data: no record with a schedule")
    agg = frame.groupby(["hw_id", "op_id", "schedule_json"], sort=True, dropna=False).agg(
        op_text=("op_text", "first"), hw_json=("hw_json", "first"), m=("m", "median"),
        measurements=("status", "size"),
    ).reset_index()
    X, good = F.feature_matrix(agg)
    if not good.all():
        dropped["schedules with an unreadable op, schedule or hardware"] = int((~good).sum())
    agg, X = agg.loc[good].reset_index(drop=True), X[good]
    best = agg.groupby(["hw_id", "op_id"], sort=False)["m"].transform("min")
    size = agg.groupby(["hw_id", "op_id"], sort=False)["m"].transform("size")
    usable = (best.notna() & (size >= 2)).to_numpy()
    if not usable.all():
        dropped["schedules in groups without an ok row or with one schedule"] = \
            int((~usable).sum())
    agg, X = agg.loc[usable].reset_index(drop=True), X[usable]
    best_s = best[usable].to_numpy(dtype=np.float64)
    if agg.empty:
        raise CostModelError(
            "no training data: no (op, hardware) group has an ok measurement and at least two "
            "schedules"
        )
    m = agg["m"].to_numpy(dtype=np.float64)
    label = np.where(np.isnan(m), 0.0, best_s / np.where(np.isnan(m), 1.0, m))
    gcode, _ = pd.factorize(pd.MultiIndex.from_frame(agg[["hw_id", "op_id"]]), sort=False)
    rows = pd.DataFrame({
        "group": gcode, "hw_id": agg["hw_id"], "op_id": agg["op_id"], "op_text": agg["op_text"],
        "schedule_json": agg["schedule_json"], "median_s": m, "label": label,
        "measurements": agg["measurements"],
    })
    groups = rows.groupby("group", sort=True).agg(
        hw_id=("hw_id", "first"), op_id=("op_id", "first"), op_text=("op_text", "first"),
        size=("label", "size")).reset_index(drop=True)
    digest = hashlib.sha256()
    for key in zip(rows["hw_id"], rows["op_id"], rows["schedule_json"], rows["median_s"],
                   strict=True):
        digest.update(repr(key).encode())
    return TrainingSet(X, rows, groups, digest.hexdigest()[:16], dropped, len(df))


# -- parameters -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TrainParams:
    """XGBoost settings (defaults chosen by by-operator cross-validation, see COSTMODEL.md)."""

    objective: str = "rank:ndcg"
    rounds: int = 200
    max_depth: int = 6
    eta: float = 0.1
    min_child_weight: float = 1.0
    subsample: float = 0.8
    colsample_bytree: float = 0.8
    reg_lambda: float = 1.0
    pair_method: str = "topk"
    pairs_per_sample: int = 8
    prior_weight: float = 3.0
    seed: int = 0
    nthread: int = 0

    def xgb_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "objective": self.objective,
            "tree_method": "hist",
            "max_depth": self.max_depth,
            "eta": self.eta,
            "min_child_weight": self.min_child_weight,
            "subsample": self.subsample,
            "colsample_bytree": self.colsample_bytree,
            "lambda": self.reg_lambda,
            "seed": self.seed,
            "nthread": self.nthread or min(4, os.cpu_count() or 1),
        }
        if self.objective.startswith("rank:"):
            params["lambdarank_pair_method"] = self.pair_method
            params["lambdarank_num_pair_per_sample"] = self.pairs_per_sample
        return params

    @property
    def prior(self) -> float:
        """The analytic prior's weight in effect (ranking objectives only)."""
        return self.prior_weight if self.objective.startswith("rank:") else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


NDCG_GRADES = 30


def _targets(labels: np.ndarray, objective: str) -> np.ndarray:
    if objective == "rank:ndcg":
        # NDCG wants integer relevance grades; speed squared spreads the fast end.
        return np.floor(labels**2 * NDCG_GRADES + 1e-9)
    return labels


def prior_margin(X: np.ndarray, weight: float) -> np.ndarray:
    """The analytic estimate as the starting score: ``weight * -log2(estimated seconds)``.

    Boosting starts from the tiler's ranking and the trees learn corrections to it, so with
    little data the model falls back to the analytic order instead of to noise. Rows without
    an estimate (illegal schedules) start as if
    they took 2^64 s — within one op either all rows have an estimate or none.
    """
    est = X[:, _EST].astype(np.float64)
    return weight * -np.where(np.isnan(est), 64.0, est)


def _dmatrix(X: np.ndarray, prior_weight: float, labels: np.ndarray | None = None,
             qid: np.ndarray | None = None) -> Any:
    import xgboost as xgb

    margin = prior_margin(X, prior_weight) if prior_weight else None
    return xgb.DMatrix(np.ascontiguousarray(X, dtype=np.float32), label=labels, qid=qid,
                       base_margin=margin, feature_names=list(F.FEATURE_NAMES))


def _train_booster(data: TrainingSet, params: TrainParams) -> Any:
    import xgboost as xgb

    dtrain = _dmatrix(data.X, params.prior, _targets(data.labels, params.objective),
                      data.group)
    return xgb.train(params.xgb_params(), dtrain, num_boost_round=params.rounds)


def _library_versions() -> dict[str, str]:
    from importlib import metadata

    import xgboost as xgb

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "unknown"

    return {"xgboost": xgb.__version__, "numpy": np.__version__, "pandas": pd.__version__,
            "tunecache": version("tunecache"), "python": platform.python_version()}


# -- the model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelMeta:
    """What ``meta.json`` holds; ``model_sha256`` ties it to its ``model.json``."""

    model_version: str
    feature_version: int
    feature_names: tuple[str, ...]
    model_sha256: str
    created_at: str
    params: dict[str, Any]
    training: dict[str, Any]
    metrics: dict[str, Any] | None = None
    libraries: dict[str, str] = field(default_factory=dict)
    meta_format: int = META_FORMAT

    def to_json(self) -> str:
        data = asdict(self)
        data["feature_names"] = list(self.feature_names)
        data["feature_names_digest"] = hashlib.sha256(
            "\n".join(self.feature_names).encode()).hexdigest()[:16]
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> ModelMeta:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{where}: meta.json is not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ModelLoadError(f"{where}: meta.json must be a JSON object")
        fmt = data.get("meta_format")
        if fmt != META_FORMAT:
            raise ModelLoadError(
                f"{where}: meta.json format {fmt!r} is not supported (this tunecache reads "
                f"format {META_FORMAT})"
            )
        needed = ("model_version", "feature_version", "feature_names", "model_sha256",
                  "created_at", "params", "training")
        absent = [k for k in needed if k not in data]
        if absent:
            raise ModelLoadError(f"{where}: meta.json lacks {', '.join(absent)}")
        names, version = data["feature_names"], data["feature_version"]
        if not isinstance(version, int) or isinstance(version, bool) or \
                not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ModelLoadError(f"{where}: meta.json has a malformed feature_version or "
                                 "feature_names")
        for key in ("model_version", "model_sha256", "created_at"):
            if not isinstance(data[key], str):
                raise ModelLoadError(f"{where}: meta.json {key} must be a string")
        return cls(
            model_version=data["model_version"], feature_version=version,
            feature_names=tuple(names), model_sha256=data["model_sha256"],
            created_at=data["created_at"], params=dict(data["params"]),
            training=dict(data["training"]), metrics=data.get("metrics"),
            libraries=dict(data.get("libraries") or {}), meta_format=fmt,
        )


def check_compatible(meta: ModelMeta, where: str) -> None:
    """Refuse a model whose feature version or layout differs from this code's."""
    if meta.feature_version != F.FEATURE_VERSION:
        raise FeatureVersionError(
            f"{where}: model {meta.model_version} was trained with feature version "
            f"{meta.feature_version}, this tunecache computes feature version "
            f"{F.FEATURE_VERSION}; retrain it (tunecache model train)"
        )
    if tuple(meta.feature_names) != F.FEATURE_NAMES:
        raise FeatureVersionError(
            f"{where}: model {meta.model_version} has feature version {meta.feature_version} "
            f"like this tunecache but a different feature layout ({len(meta.feature_names)} "
            f"vs {len(F.FEATURE_NAMES)} columns); retrain it (tunecache model train)"
        )


@dataclass(frozen=True)
class Evaluation:
    """Held-out (or given-data) ranking quality of the model and of the analytic estimate.

    ``per_group`` has one row per (hardware, op) with ``model_*`` and ``analytic_*`` columns
    (top1, top5, pairwise, spearman, to_reach) and ``random_to_reach``. ``scores`` holds the
    model's score for every row of the evaluated :class:`TrainingSet` (for plots).
    """

    model: M.RankingMetrics
    analytic: M.RankingMetrics
    search: M.SearchEfficiency
    per_group: pd.DataFrame
    split: str
    scores: np.ndarray = field(repr=False)
    data: TrainingSet = field(repr=False)

    def to_dict(self, per_group: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "split": self.split, "model": self.model.to_dict(),
            "analytic": self.analytic.to_dict(), "search": self.search.to_dict(),
        }
        if per_group:
            out["per_group"] = json.loads(self.per_group.to_json(orient="records"))
        return out


def _evaluate_scores(data: TrainingSet, scores: np.ndarray, split: str) -> Evaluation:
    labels = data.labels
    analytic = -data.X[:, _EST].astype(np.float64)
    bounds = np.flatnonzero(np.diff(data.group)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(labels)]])
    records = []
    for g, (a, b) in enumerate(zip(starts, ends, strict=True)):
        lab = labels[a:b]
        model = M.group_metrics(scores[a:b], lab)
        est = analytic[a:b]
        tiler = M.group_metrics(est, lab) if not np.isnan(est).all() else \
            dict.fromkeys(model, math.nan)
        info = data.groups.iloc[g]
        records.append({
            "hw_id": info["hw_id"], "op_id": info["op_id"], "op_text": info["op_text"],
            "candidates": int(b - a), "failed": int((lab == 0).sum()),
            **{f"model_{k}": v for k, v in model.items()},
            **{f"analytic_{k}": v for k, v in tiler.items()},
            "random_to_reach": M.random_measurements_to_reach(lab),
        })
    table = pd.DataFrame.from_records(records)
    search = M.SearchEfficiency(
        reach=M.REACH, model=float(table["model_to_reach"].mean()),
        analytic=float(table["analytic_to_reach"].mean()),
        random=float(table["random_to_reach"].mean()),
    )
    return Evaluation(M.summarise(table, "model"), M.summarise(table, "analytic"), search,
                      table, split, scores, data)


class CostModel:
    """A trained ranking model with its metadata. Build with :meth:`fit` or :meth:`load`."""

    def __init__(self, booster: Any, meta: ModelMeta) -> None:
        self._booster = booster
        self.meta = meta
        self.version: str = meta.model_version
        """The model's version id (``f<feature version>-<hash of model.json>``)."""
        known = {f.name for f in fields(TrainParams)}
        prior = TrainParams(**{k: v for k, v in meta.params.items() if k in known}).prior
        if isinstance(prior, bool) or not isinstance(prior, (int, float)):
            raise ModelLoadError(f"model {meta.model_version}: meta.json params.prior_weight "
                                 f"must be a number, got {prior!r}")
        self._prior = float(prior)

    # -- training -------------------------------------------------------------------------

    @classmethod
    def fit(cls, df: pd.DataFrame | TrainingSet, params: TrainParams | None = None,
            metrics: dict[str, Any] | None = None) -> CostModel:
        """Train on store rows (or a prepared :class:`TrainingSet`); ``metrics`` go to meta."""
        params = params or TrainParams()
        data = df if isinstance(df, TrainingSet) else prepare(df)
        start = time.perf_counter()
        booster = _train_booster(data, params)
        train_s = time.perf_counter() - start
        raw = bytes(booster.save_raw(raw_format="json"))
        sha = hashlib.sha256(raw).hexdigest()
        meta = ModelMeta(
            model_version=f"f{F.FEATURE_VERSION}-{sha[:12]}",
            feature_version=F.FEATURE_VERSION,
            feature_names=F.FEATURE_NAMES,
            model_sha256=sha,
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            params=params.to_dict(),
            training={
                "fingerprint": data.fingerprint,
                "source_rows": data.source_rows,
                "rows": len(data.rows),
                "groups": len(data.groups),
                "ops": int(data.groups["op_id"].nunique()),
                "hw_ids": sorted(data.groups["hw_id"].unique().tolist()),
                "failed_rows": int((data.labels == 0).sum()),
                "dropped": data.dropped,
                "train_seconds": round(train_s, 3),
            },
            metrics=metrics,
            libraries=_library_versions(),
        )
        return cls(booster, meta)

    # -- use ------------------------------------------------------------------------------

    def covers(self, hw: HardwareSpec | str) -> bool:
        """Whether to rank with this model on ``hw``: the training data held measurements
        from it, or :meth:`transfers` (it ranks hardware it never saw better than the
        analytic estimate does)."""
        hw_id = hw if isinstance(hw, str) else hw.hw_id
        return hw_id in self.meta.training.get("hw_ids", []) or self.transfers()

    def transfers(self) -> bool:
        """Whether the leave-one-hardware-out evaluation recorded at training
        (``metrics["by_hardware"]``) has the model's top-1 above the analytic estimate's."""
        held = (self.meta.metrics or {}).get("by_hardware")
        if not isinstance(held, dict):
            return False
        model, analytic = held.get("model"), held.get("analytic")
        try:
            return float(model["top1"]) > float(analytic["top1"])  # type: ignore[index]
        except (TypeError, KeyError, ValueError):
            return False

    def predict_matrix(self, X: np.ndarray) -> np.ndarray:
        """Scores for feature rows (``features.feature_matrix`` / ``features.matrix``)."""
        if X.shape[0] == 0:
            return np.zeros(0, dtype=np.float64)
        dm = _dmatrix(X, self._prior)
        return np.asarray(self._booster.predict(dm), dtype=np.float64)

    def predict(self, op: OpSignature, schedules: Sequence[Schedule],
                hw: HardwareSpec) -> np.ndarray:
        """One score per schedule; higher = predicted faster (comparable within this call)."""
        return self.predict_matrix(F.matrix(op, schedules, hw))

    def rank(self, op: OpSignature, schedules: Sequence[Schedule],
             hw: HardwareSpec) -> list[tuple[Schedule, float]]:
        """``(schedule, score)`` best first; equal scores keep the given order."""
        scores = self.predict(op, schedules, hw)
        return [(schedules[i], float(scores[i])) for i in M.order(scores)]

    def evaluate(self, df: pd.DataFrame | TrainingSet) -> Evaluation:
        """This model's ranking quality on ``df`` (next to the analytic estimate's)."""
        data = df if isinstance(df, TrainingSet) else prepare(df)
        return _evaluate_scores(data, self.predict_matrix(data.X), "given data")

    # -- files ----------------------------------------------------------------------------

    def model_bytes(self) -> bytes:
        """``model.json``: the booster in XGBoost's JSON format."""
        return bytes(self._booster.save_raw(raw_format="json"))

    def meta_bytes(self) -> bytes:
        return (self.meta.to_json() + "\n").encode()

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``model.json`` then ``meta.json`` (meta last: a dir with meta is complete)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for name, data in ((MODEL_FILE, self.model_bytes()), (META_FILE, self.meta_bytes())):
            temp = out / f".{name}.{os.getpid()}.tmp"
            temp.write_bytes(data)
            os.replace(temp, out / name)
        return out

    @classmethod
    def from_bytes(cls, model: bytes, meta: bytes, where: str = "model") -> CostModel:
        """Load from the two files' contents, validating everything (see :meth:`load`)."""
        try:
            meta_text = meta.decode()
        except UnicodeDecodeError:
            raise ModelLoadError(f"{where}: meta.json is not UTF-8 text") from None
        info = ModelMeta.from_json(meta_text, where)
        check_compatible(info, where)
        if hashlib.sha256(model).hexdigest() != info.model_sha256:
            raise ModelLoadError(
                f"{where}: model.json does not match meta.json (hash differs): damaged or "
                "replaced; retrain or restore it"
            )
        _check_structure(model, where)
        import xgboost as xgb

        try:
            booster = xgb.Booster(model_file=bytearray(model))
        except xgb.core.XGBoostError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "unreadable"
            raise ModelLoadError(f"{where}: model.json cannot be loaded: {first}") from None
        if booster.num_features() != len(F.FEATURE_NAMES):
            raise ModelLoadError(
                f"{where}: model.json expects {booster.num_features()} features, this "
                f"tunecache computes {len(F.FEATURE_NAMES)}"
            )
        return cls(booster, info)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> CostModel:
        """Load a model directory; refuses missing or damaged files and other feature versions."""
        base = Path(directory)
        if not base.is_dir():
            raise ModelLoadError(f"no model directory at {base}")
        files = {}
        for name in (MODEL_FILE, META_FILE):
            try:
                files[name] = read_regular(base / name, MAX_MODEL_FILE_BYTES)
            except FileNotFoundError:
                raise ModelLoadError(f"{base}: {name} is missing; not a complete model "
                                     "directory") from None
            except OSError as exc:
                raise ModelLoadError(f"{base}: cannot read {name}: {exc.strerror}") from None
        return cls.from_bytes(files[MODEL_FILE], files[META_FILE], str(base))


def _check_structure(model: bytes, where: str) -> None:
    """Refuse a ``model.json`` whose trees XGBoost would walk out of bounds
    (:mod:`tunecache.costmodel.model_check`)."""
    try:
        data = json.loads(model)
    except (ValueError, RecursionError):
        raise ModelLoadError(f"{where}: model.json is not JSON") from None
    problems = model_problems(data, len(F.FEATURE_NAMES))
    if problems:
        raise ModelLoadError(f"{where}: model.json is malformed: {problems[0]}")


# -- cross-validation -----------------------------------------------------------------------


def op_folds(data: TrainingSet, folds: int, seed: int = 0) -> np.ndarray:
    """Fold index per group from scikit-learn's ``GroupKFold`` over operators (shuffled,
    seeded).

    Every group of one operator (on any hardware) lands in the same fold, so a held-out
    fold's operators were never seen in training.
    """
    from sklearn.model_selection import GroupKFold  # only evaluation needs scikit-learn

    return _fold_index(GroupKFold(n_splits=folds, shuffle=True, random_state=seed),
                       data.groups["op_id"].to_numpy())


def hardware_folds(data: TrainingSet) -> np.ndarray:
    """Fold index per group from scikit-learn's ``LeaveOneGroupOut`` over hardware: each
    fold holds out every measurement of one ``hw_id``."""
    from sklearn.model_selection import LeaveOneGroupOut

    return _fold_index(LeaveOneGroupOut(), data.groups["hw_id"].to_numpy())


def _fold_index(splitter: Any, keys: np.ndarray) -> np.ndarray:
    fold = np.full(len(keys), -1, dtype=np.int64)
    for k, (_, held) in enumerate(splitter.split(keys, groups=keys)):
        fold[held] = k
    return fold


def cross_validate(df: pd.DataFrame | TrainingSet, folds: int = 5,
                   params: TrainParams | None = None, seed: int = 0,
                   by: str = "op") -> Evaluation:
    """Held-out evaluation: every group is scored once by a model that never saw its
    operator (``by="op"``, k-fold over operators) or its hardware (``by="hardware"``,
    leave-one-hardware-out)."""
    params = params or TrainParams()
    data = df if isinstance(df, TrainingSet) else prepare(df)
    if by == "op":
        n_ops = int(data.groups["op_id"].nunique())
        if n_ops < 2:
            raise CostModelError(f"cross-validation by operator needs at least 2 operators, "
                                 f"the data has {n_ops}")
        folds = max(2, min(folds, n_ops))
        fold = op_folds(data, folds, seed)
        split = f"{folds}-fold by operator ({n_ops} ops)"
    elif by == "hardware":
        n_hw = int(data.groups["hw_id"].nunique())
        if n_hw < 2:
            raise CostModelError(f"leave-one-hardware-out needs records from at least 2 "
                                 f"hardware ids, the data has {n_hw}")
        fold = hardware_folds(data)
        folds = n_hw
        split = f"leave-one-hardware-out ({n_hw} hardware ids)"
    else:
        raise CostModelError(f"unknown split {by!r}: use 'op' or 'hardware'")
    scores = np.full(len(data.rows), np.nan)
    row_fold = fold[data.group]
    for k in range(folds):
        train = data.subset(fold != k)
        booster = _train_booster(train, params)
        held = row_fold == k
        scores[held] = booster.predict(_dmatrix(data.X[held], params.prior))
    return _evaluate_scores(data, scores, split)
