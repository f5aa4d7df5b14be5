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
from tunecache.compiler.schedule import MAX_THREADS
from tunecache.datasets.location import HOME_ENV, default_root

F = TypeVar("F", bound=Callable[..., Any])

EXIT_USER_ERROR = 2
EXIT_ENVIRONMENT = 1


def emit_json(data: Any) -> None:
    """Print ``data`` as JSON on stdout (sorted keys, so output is stable)."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


class BudgetError(TunecacheError):
    """A --budget value that is not a duration."""


DURATION_FORMS = ("90 or 90s (seconds), 10m, 1h, 1.5h, 1h30m, or 1h30 (= 1h30m: a bare number "
                  "after a unit counts in the next smaller unit)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0}
_NEXT_UNIT = {None: "s", "h": "m", "m": "s"}
_DURATION_PART = re.compile(r"\s*(\d{1,9}(?:\.\d{1,9})?)\s*([hms]?)", re.IGNORECASE)


def parse_duration(text: str, option: str | None = None) -> float:
    """Seconds from a duration: ``90``, ``90s``, ``10m``, ``1h``, ``1.5h``, ``1h30m``, and
    ``1h30`` (= 1 h 30 min). Units go from hours down to seconds, each at most once; a final
    bare number takes the unit after the previous one (seconds if it stands alone).
    BudgetError naming the accepted forms (and ``option``, the flag it came from) otherwise."""
    given = f"{option} {text!r}" if option else repr(text)
    seconds = _duration_seconds(text)
    if seconds is None:
        raise BudgetError(f"{given} is not a duration; use {DURATION_FORMS}")
    if seconds <= 0:
        raise BudgetError(f"{given} must be positive")
    return seconds


def _duration_seconds(text: str) -> float | None:
    total = 0.0
    last: str | None = None
    position = 0
    body = text.strip()
    if not body:
        return None
    while position < len(body):
        match = _DURATION_PART.match(body, position)
        if match is None:
            return None
        number, unit = float(match.group(1)), match.group(2).lower() or None
        if unit is None:
            unit = _NEXT_UNIT.get(last)
            if unit is None or match.end() != len(body):
                return None  # a bare number after seconds, or not at the end
        order = "hms"
        if last is not None and order.index(unit) <= order.index(last):
            return None  # units repeated or out of order ("30m1h", "1h1h")
        total += number * _UNIT_SECONDS[unit]
        last = unit
        position = match.end()
    return total


def json_option(func: F) -> F:
    """Add ``--json`` (stored as ``as_json``) to a command."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")(func)


def _store_root(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A local store root that exists must be a folder: a file there would read as an empty
    store (``cache verify`` would say ok)."""
    root = value if value is not None else default_root()
    if "://" not in root and Path(root).exists() and not Path(root).is_dir():
        where = "" if value is not None else f" (${HOME_ENV})"
        raise click.BadParameter(f"{root}{where} is not a folder; a store is a folder "
                                 "(created on first write) or an s3:// URI", param=param)
    return value


def root_option(func: F) -> F:
    """Add ``--root PATH|URI`` (stored as ``root``, default None): the store to use."""
    return click.option(
        "--root", default=None, metavar="PATH|URI", callback=_store_root,
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
        return click.option("--threads", "threads", type=click.IntRange(1, MAX_THREADS),
                            default=None, help=help_text)(func)

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


def score(value: float | None) -> str:
    """A ranking score (0..1) for the terminal; ``n/a`` when absent or NaN."""
    return "n/a" if value is None or value != value else f"{float(value):.3f}"


def echo_held_out(metrics: dict[str, Any] | None, transfers: bool) -> None:
    """The held-out evaluations recorded with a model: by operator (the metrics' own
    ``model``/``analytic``) and by hardware (``by_hardware``), and whether the model is used
    on hardware it never saw."""
    if not metrics:
        return
    if "model" in metrics:
        _echo_split("by operator", metrics)
    held = metrics.get("by_hardware")
    if held:
        _echo_split("by hardware", held)
        click.echo("used on unseen hardware: " + ("yes" if transfers else "no"))


def _echo_split(name: str, held: dict[str, Any]) -> None:
    m, a = held["model"], held["analytic"]
    click.echo(f"held-out {name}: top-1 {score(m['top1'])} (analytic {score(a['top1'])}), "
               f"top-5 {score(m['top5'])} (analytic {score(a['top5'])})")
