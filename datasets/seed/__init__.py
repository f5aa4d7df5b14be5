"""The seed shipped with tunecache: what the project's own machines measured, as data.

``store/`` under this package is a read-only store (records, published snapshots with each
hardware's spec, and a cost model) built by ``tools/build_seed`` from the measurements of
every machine the project's developers and CI ran on (docs/SEED.md). A fresh install serves
from it when its own store misses: the seed's exact hardware when the machine is one of
them, else the nearest one whose code runs here, and ranks candidates with its model.

``$TUNECACHE_SEED`` set to ``off`` (or ``0``, ``none``) turns the seed off; set to a path or
URI, it names another seed store (a farm's own).
"""

from __future__ import annotations

import os
from pathlib import Path

from tunecache.datasets.location import Location, resolve

SEED_ENV = "TUNECACHE_SEED"
SEED_STORE = Path(__file__).resolve().parent / "store"
"""Where the shipped seed store lives."""

_OFF = ("0", "off", "none", "false", "no")


def seed_location() -> Location | None:
    """The seed store to fall back on, or None when it is turned off or absent."""
    env = os.environ.get(SEED_ENV, "").strip()
    if env.lower() in _OFF:
        return None
    if env:
        return resolve(env)
    return resolve(SEED_STORE) if SEED_STORE.is_dir() else None
