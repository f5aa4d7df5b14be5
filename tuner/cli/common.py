"""Shared pieces of the ``tunecache`` command line: JSON output, durations, and the options
several commands take (each written once here so flags, defaults and help agree)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from tunecache.compiler.errors import TunecacheError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_USER_ERROR = 2


def emit_json(data: Any) -> None:
    """Print ``data`` as JSON on stdout (sorted keys, so output is stable)."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


class BudgetError(TunecacheError):
    """A --budget value that is not a duration."""


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``1.5h`` or ``1h30m``."""
    match = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*",
                         text)
    if not text.strip() or match is None or not any(match.groups()):
        raise BudgetError(f"--budget {text!r} is not a duration; use e.g. 600, 90s, 15m, 1h30m")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise BudgetError(f"--budget {text!r} must be positive")
    return total


def json_option(func: F) -> F:
    """Add ``--json`` (stored as ``as_json``) to a command."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")(func)


def root_option(func: F) -> F:
    """Add ``--root PATH|URI`` (stored as ``root``, default None): the store to use."""
    return click.option(
        "--root", default=None, metavar="PATH|URI",
        help="Store root (default: $TUNECACHE_HOME, else the user cache directory).",
    )(func)


def hardware_option(func: F) -> F:
    """Add ``--hardware FILE`` (stored as ``hardware``, default None): a pinned hardware spec."""
    return click.option(
        "--hardware", "hardware", type=click.Path(dir_okay=False, path_type=Path), default=None,
        help="Hardware spec JSON to use instead of detection ($TUNECACHE_HARDWARE also works).",
    )(func)


def hw_id_option(func: F) -> F:
    """Add ``--hw-id ID`` (stored as ``hw_id``, default None): limit a command to one hardware."""
    return click.option("--hw-id", "hw_id", default=None, help="Only this hardware.")(func)


def hw_ids_option(func: F) -> F:
    """Add a repeatable ``--hw-id ID`` (stored as the tuple ``hw_ids``; empty: every hardware)."""
    return click.option("--hw-id", "hw_ids", multiple=True,
                        help="Only this hardware (repeatable).")(func)


def threads_option_with(help_text: str) -> Callable[[F], F]:
    """``--threads N`` (N >= 1, stored as ``threads``, default None) with ``help_text`` saying
    what the count is for; commands whose threads mean the same use :func:`threads_option`."""

    def decorate(func: F) -> F:
        return click.option("--threads", "threads", type=click.IntRange(min=1), default=None,
                            help=help_text)(func)

    return decorate


threads_option = threads_option_with(
    "Threads per kernel (default: every core, and fewer for small ops).")
"""``--threads``: the thread count of the kernels a command tunes or ranks."""


def no_baseline_option(func: F) -> F:
    """Add ``--no-baseline`` (stored as ``no_baseline``): skip timing the baseline."""
    return click.option(
        "--no-baseline", "no_baseline", is_flag=True,
        help="Skip timing the op kind's baseline (numpy, or onnxruntime when installed).",
    )(func)


def folds_option_with(help_text: str) -> Callable[[F], F]:
    """``--folds N`` (stored as ``folds``, default 5): by-operator cross-validation folds, with
    ``help_text`` saying what they are for in the command."""

    def decorate(func: F) -> F:
        return click.option("--folds", "folds", type=int, default=5, show_default=True,
                            help=help_text)(func)

    return decorate
