"""Shared pieces of the ``tunecache`` command line: JSON output and option helpers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

EXIT_USER_ERROR = 2


def emit_json(data: Any) -> None:
    """Print ``data`` as JSON on stdout (sorted keys, so output is stable)."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def json_option(func: F) -> F:
    """Add ``--json`` (stored as ``as_json``) to a command."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")(func)
