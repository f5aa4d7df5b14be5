"""Models kept in a store root: ``models/<version>/`` plus an atomically replaced pointer.

::

    <root>/models/<model_version>/model.json    XGBoost JSON
    <root>/models/<model_version>/meta.json     written after model.json: marks it complete
    <root>/models/CURRENT                       {"model_version": "..."} — the current model

The root is a local directory or any URI pyarrow's filesystems understand (like the records).
Locally files are written under a hidden temporary name, fsynced and renamed; on object
stores each file is one PUT, which is all-or-nothing. Saving a model and making it current
are two steps, so a crash in between leaves the previous model current.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.hardware import HardwareSpec
from tunecache.costmodel.model import META_FILE, MODEL_FILE, CostModel, ModelLoadError
from tunecache.datasets import fs, location
from tunecache.datasets.location import Location
from tunecache.datasets.seed import seed_location

_log = logging.getLogger("tunecache.costmodel")

MODELS_DIR = "models"
POINTER = "CURRENT"
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def _check_version(version: str) -> str:
    if not _VERSION_RE.fullmatch(version) or ".." in version:
        raise ModelLoadError(f"{version!r} is not a model version name")
    return version


def save(model: CostModel, root: str | os.PathLike[str] | Location | None = None, *,
         make_current: bool = True) -> str:
    """Store ``model`` under ``models/<version>/`` (and point ``CURRENT`` at it); its version."""
    loc = location.resolve(root)
    version = _check_version(model.version)
    fs.write_atomic(loc, f"{MODELS_DIR}/{version}/{MODEL_FILE}", model.model_bytes())
    fs.write_atomic(loc, f"{MODELS_DIR}/{version}/{META_FILE}", model.meta_bytes())
    if make_current:
        set_current(root if not isinstance(root, Location) else loc, version)
    return version


def set_current(root: str | os.PathLike[str] | Location | None, version: str) -> None:
    """Point ``CURRENT`` at a stored model (which must exist and load)."""
    loc = location.resolve(root)
    load_version(loc, version)
    pointer = json.dumps({"model_version": _check_version(version)}, sort_keys=True) + "\n"
    fs.write_atomic(loc, f"{MODELS_DIR}/{POINTER}", pointer.encode())


def current_version(root: str | os.PathLike[str] | Location | None = None) -> str | None:
    """The version ``CURRENT`` names, or None when no model was made current."""
    loc = location.resolve(root)
    raw = fs.read_bytes(loc, f"{MODELS_DIR}/{POINTER}")
    if raw is None:
        return None
    try:
        data: Any = json.loads(raw)
        version = data["model_version"]
    except (ValueError, KeyError, TypeError):
        raise ModelLoadError(f"{loc.uri}: {MODELS_DIR}/{POINTER} is damaged") from None
    if not isinstance(version, str):
        raise ModelLoadError(f"{loc.uri}: {MODELS_DIR}/{POINTER} is damaged")
    return _check_version(version)


def load_version(root: str | os.PathLike[str] | Location | None, version: str) -> CostModel:
    """Load ``models/<version>/`` from a store (validated like :meth:`CostModel.load`)."""
    loc = location.resolve(root)
    version = _check_version(version)
    where = f"{loc.uri}/{MODELS_DIR}/{version}"
    model_raw = fs.read_bytes(loc, f"{MODELS_DIR}/{version}/{MODEL_FILE}")
    meta_raw = fs.read_bytes(loc, f"{MODELS_DIR}/{version}/{META_FILE}")
    if model_raw is None or meta_raw is None:
        missing = MODEL_FILE if model_raw is None else META_FILE
        raise ModelLoadError(f"{where}: {missing} is missing; not a complete model")
    return CostModel.from_bytes(model_raw, meta_raw, where)


def load_current(root: str | os.PathLike[str] | Location | None = None,
                 hw: HardwareSpec | str | None = None) -> CostModel | None:
    """The current model, or None when there is none (or, with ``hw``, none trained on it).

    A damaged pointer or model, or one of another feature version, raises
    :class:`ModelLoadError` (a subclass names the feature-version case).
    """
    version = current_version(root)
    if version is None:
        return None
    model = load_version(root, version)
    if hw is not None and not model.covers(hw):
        return None
    return model


TRAINED = "trained"
SEED = "seed"


@dataclass(frozen=True, slots=True)
class ServingModel:
    """A cost model that ranks candidates, and where it comes from: ``source`` is
    :data:`TRAINED` (the store's current model, trained on its records) or :data:`SEED`
    (the shipped seed's, :mod:`tunecache.datasets.seed`); ``store`` is the URI of the store
    that holds it."""

    model: CostModel
    source: str
    store: str


def find_serving(root: str | os.PathLike[str] | Location | None,
                 hw: HardwareSpec | str | None = None) -> ServingModel | None:
    """The model a compile on ``hw`` ranks candidates with (any hardware when None): the
    store's current model when it covers ``hw``, else the shipped seed's when that does,
    else None. The one place that decides, for compiles and for ``tunecache model show``.

    Its error policy, the same for every caller: a damaged store model (its pointer, its
    files, or one of another feature version) raises :class:`ModelLoadError`, since the
    store is the user's to repair; a damaged or stale seed model counts as absent.
    """
    loc = location.resolve(root)
    seed = seed_location()
    model = load_current(loc, hw)
    if model is not None:
        return ServingModel(model, SEED if seed is not None and seed.uri == loc.uri
                            else TRAINED, loc.uri)
    if seed is None or seed.uri == loc.uri:
        return None
    try:
        model = load_current(seed, hw)
    except ModelLoadError:
        return None
    return ServingModel(model, SEED, seed.uri) if model is not None else None


def load_serving(root: str | os.PathLike[str] | Location | None,
                 hw: HardwareSpec) -> CostModel | None:
    """The model :func:`find_serving` finds for ``hw`` (None when there is none)."""
    found = find_serving(root, hw)
    return found.model if found is not None else None


def usable_model(root: str | os.PathLike[str] | Location | None,
                 hw: HardwareSpec) -> CostModel | None:
    """:func:`load_serving` for a caller that goes on without a model (a compile, a tuning
    job: the tiler's estimate ranks then): a damaged or incompatible store model is logged
    as a warning and not used."""
    try:
        return load_serving(root, hw)
    except TunecacheError as exc:
        _log.warning("not using the cost model: %s", exc)
        return None


def list_versions(root: str | os.PathLike[str] | Location | None = None) -> list[str]:
    """Versions stored under ``models/`` (complete or not), sorted."""
    loc = location.resolve(root)
    return sorted(info.base_name for info in fs.infos(loc, loc.path(MODELS_DIR))
                  if info.type == pafs.FileType.Directory and _VERSION_RE.fullmatch(info.base_name))
