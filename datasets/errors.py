"""Errors raised for malformed records and datasets."""

from __future__ import annotations

from tunecache.compiler.errors import TunecacheError


class DatasetError(TunecacheError):
    """A dataset or record is malformed, or a dataset location is unusable."""


class SchemaError(DatasetError, ValueError):
    """A table or file does not fit the canonical record schema."""


class PathPartError(DatasetError, ValueError):
    """A value that becomes part of a store path is unsafe (separators, ``..``, odd chars)."""


class DamagedFragmentWarning(UserWarning):
    """A fragment could not be read (truncated, corrupt, wrong schema) and was skipped."""
