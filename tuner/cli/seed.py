"""``tunecache seed``: the measured seed shipped with tunecache (or a farm's own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tunecache.cache.nearest import CacheView
from tunecache.compiler.hardware import local_spec
from tunecache.costmodel import registry
from tunecache.datasets.seed import SEED_ENV, SEED_STORE, seed_location
from tunecache.tuner.cli.common import (
    echo_held_out,
    emit_json,
    folds_option_with,
    hardware_option,
    json_option,
)
from tunecache.tuner.jobs.seed import build_seed, read_manifest


@click.group("seed")
def seed_group() -> None:
    """The seed: measurements and a cost model from the project's machines (docs/SEED.md)."""


@seed_group.command("build")
@click.argument("sources", nargs=-1, required=True, metavar="SOURCE...")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=SEED_STORE,
              show_default=True, help="The seed store to (re)build.")
@folds_option_with("By-operator cross-validation folds recorded with the model.")
@json_option
def seed_build(sources: tuple[str, ...], out: Path, folds: int, as_json: bool) -> None:
    """Build a seed store from the records of SOURCE stores (directories or URIs) and
    .parquet files: publish each hardware and train the cost model, with its held-out
    evaluations by operator and by hardware."""
    summary = build_seed(sources, out, folds=folds,
                         log=lambda line: click.echo(line, err=True) if not as_json else None)
    if as_json:
        emit_json(summary.to_dict())
        return
    _describe(summary.to_dict())


@seed_group.command("show")
@hardware_option
@json_option
def seed_show(hardware: Path | None, as_json: bool) -> None:
    """What the seed holds, and what it serves on this machine."""
    loc = seed_location()
    if loc is None:
        raise click.ClickException(f"no seed: ${SEED_ENV} turns it off, or the shipped one "
                                   "is absent")
    manifest = read_manifest(loc.base) if loc.local else None
    hw = local_spec(hardware)
    view = CacheView([(loc, "seed")], hw)
    model = registry.load_current(loc)
    here: dict[str, Any] = {
        "hw_id": hw.hw_id, "exact_entries": view.exact_entries,
        "neighbours": [{"hw_id": h, "distance": round(d, 3)} for h, d, _ in view.neighbours()],
        "model_used": bool(model is not None and model.covers(hw)),
    }
    data = {"seed": loc.uri, "manifest": manifest.to_dict() if manifest else None, "here": here}
    if as_json:
        emit_json(data)
        return
    click.echo(f"seed: {loc.uri}")
    if manifest is not None:
        _describe(manifest.to_dict())
    near = ", ".join(f"{n['hw_id']} (distance {n['distance']})" for n in here["neighbours"])
    click.echo(f"this machine {hw.hw_id}: {here['exact_entries']} exact entries; nearest: "
               f"{near or 'none whose code runs here'}; cost model "
               f"{'used' if here['model_used'] else 'not used'}")


def _describe(summary: dict[str, Any]) -> None:
    click.echo(f"{summary['records']} records, {summary['bytes'] / 1e6:.1f} MB, built "
               f"{summary['built_at']}")
    for h in summary["hardware"]:
        click.echo(f"  {h['hw_id']}: {h['isa']}, {h['cores']} cores, {h['cpu_model']}: "
                   f"{h['records']} records of {h['ops']} ops, {h['published']} published")
    click.echo(f"cost model {summary['model_version']}")
    echo_held_out({**(summary["by_operator"] or {}), "by_hardware": summary["by_hardware"]},
                  summary["model_transfers"])


COMMANDS: list[click.Command] = [seed_group]
