"""``tunecache build-cache``: what the kernel build cache holds, and pruning it."""

from __future__ import annotations

import time
from pathlib import Path

import click

from tunecache.compiler.backends.cpu import artifacts
from tunecache.compiler.backends.cpu.build import BUILD_CACHE_ENV, build_cache_dir
from tunecache.tuner.cli.common import emit_json, json_option

_KINDS = {"kernel": "kernels", "header": "precompiled headers", "stray": "dead builds' files"}


def _dir_option(func: click.decorators.FC) -> click.decorators.FC:
    return click.option(
        "--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=None,
        help=f"Build cache directory (default: ${BUILD_CACHE_ENV}, else the user cache "
             "directory's tunecache/kernels).")(func)


@click.group("build-cache")
def build_cache_group() -> None:
    """The kernel build cache: shared objects, sources, precompiled headers."""


@build_cache_group.command("stats")
@_dir_option
@json_option
def stats_command(directory: Path | None, as_json: bool) -> None:
    """Kernels, precompiled headers and bytes in the build cache."""
    found = artifacts.summary(directory or build_cache_dir())
    if as_json:
        emit_json(found.to_dict())
        return
    click.echo(f"build cache  {found.root}")
    for kind, label in _KINDS.items():
        click.echo(f"{label:<20} {found.counts[kind]:>7}  {_mib(found.bytes[kind])}")
    if found.oldest is not None and found.newest is not None:
        click.echo(f"built between {_when(found.oldest)} and {_when(found.newest)}")


@build_cache_group.command("prune")
@click.option("--keep-days", type=click.FloatRange(min=0.0), default=None,
              help="Remove what was built more than this many days ago.")
@click.option("--max-mib", type=click.FloatRange(min=0.0), default=None,
              help="Then remove the oldest until the cache holds at most this many MiB.")
@click.option("--dry-run", is_flag=True, help="Say what would go; remove nothing.")
@_dir_option
@json_option
def prune_command(keep_days: float | None, max_mib: float | None, dry_run: bool,
                  directory: Path | None, as_json: bool) -> None:
    """Remove old kernels and headers (they are built again when next used); dead builds'
    temporary files always go."""
    root = directory or build_cache_dir()
    now = time.time()
    doomed = artifacts.prunable(
        artifacts.entries(root, now), now,
        keep_s=None if keep_days is None else keep_days * 86400.0,
        max_bytes=None if max_mib is None else int(max_mib * 2**20))
    if not dry_run:
        for entry in doomed:
            artifacts.remove(entry)
    counts = {kind: sum(e.kind == kind for e in doomed) for kind in _KINDS}
    freed = sum(e.bytes for e in doomed)
    if as_json:
        emit_json({"root": str(root), "dry_run": dry_run, "removed": counts,
                   "bytes": freed})
        return
    verb = "would remove" if dry_run else "removed"
    parts = ", ".join(f"{counts[kind]} {label}" for kind, label in _KINDS.items())
    click.echo(f"{verb} {parts}: {_mib(freed)} from {root}")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


COMMANDS: list[click.Command] = [build_cache_group]
