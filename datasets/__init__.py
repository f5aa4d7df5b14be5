"""tunecache.datasets: the measurement records (schema, values, reading into pandas)."""

from __future__ import annotations

from tunecache.datasets.errors import (
    DamagedFragmentWarning,
    DatasetError,
    PathPartError,
    SchemaError,
)
from tunecache.datasets.io import load, scan
from tunecache.datasets.location import default_root
from tunecache.datasets.records import Record, records_from_table, records_to_table
from tunecache.datasets.schema import SCHEMA, SCHEMA_VERSION, STATUSES

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "STATUSES",
    "DamagedFragmentWarning",
    "DatasetError",
    "PathPartError",
    "Record",
    "SchemaError",
    "default_root",
    "load",
    "records_from_table",
    "records_to_table",
    "scan",
]
