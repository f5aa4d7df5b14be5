"""``tunecache cache ...`` and ``tunecache dataset ...`` commands (the store)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from tunecache.cache.store import Store
from tunecache.tuner.cli.common import emit_json, hw_id_option, hw_ids_option, json_option, root_option


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain aligned text table (numbers right-aligned)."""
    if not rows:
        return "(none)"
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row.get(c), (int, float)) for row in rows) for c in columns]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    out = [line(columns), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _json_strings(column: pa.ChunkedArray) -> pa.Array:
    return pa.array([None if v is None else json.dumps(v) for v in column.to_pylist()],
                    pa.string())


@click.group("cache")
def cache_group() -> None:
    """The store: published schedules and record fragments."""


@cache_group.command("stats")
@root_option
@json_option
def cache_stats(root: str | None, as_json: bool) -> None:
    """Fragments, rows and bytes per partition, and what is published."""
    stats = Store(root).stats()
    if as_json:
        emit_json(stats)
        return
    click.echo(f"store: {stats['root']}")
    click.echo(_table(stats["partitions"], ["hw_id", "op_kind", "fragments", "rows", "bytes"]))
    click.echo("\npublished:")
    rows = [{"hw_id": hw, **info} for hw, info in stats["published"].items()]
    click.echo(_table(rows, ["hw_id", "entries", "snapshots", "snapshot", "published_at"]))


@cache_group.command("publish")
@root_option
@hw_ids_option
@click.option("--force", is_flag=True,
              help="Make the new snapshot current even though damaged fragments were read "
                   "or it drops entries of the current one.")
@json_option
def cache_publish(root: str | None, hw_ids: tuple[str, ...], force: bool, as_json: bool) -> None:
    """Publish the best valid measured schedule per op for each hardware.

    Refuses (exit 1) to make a snapshot current when a record fragment could not be read
    or when it would drop entries the current snapshot serves, unless --force.
    """
    results = Store(root).publish(list(hw_ids) or None, force=force)
    if as_json:
        emit_json([asdict(r) for r in results])
    else:
        rows = [{**asdict(r), "damaged": len(r.damaged)} for r in results]
        click.echo(_table(rows, ["hw_id", "entries", "records", "rejected", "damaged",
                                 "changed", "snapshot"]))
        for result in results:
            for path in result.damaged:
                click.echo(f"{result.hw_id}: damaged fragment (not read): {path}", err=True)
            for reason in result.rejections:
                click.echo(f"rejected: {reason}", err=True)
            if result.rejected:
                click.echo(f"{result.hw_id}: {result.rejected} record(s) rejected by "
                           "validation (never served)", err=True)
            if result.repaired:
                click.echo(f"{result.hw_id}: the current snapshot was damaged; rewritten as "
                           f"{result.snapshot}", err=True)
    refused = [r.refused for r in results if r.refused]
    for reason in refused:
        click.echo(f"error: {reason}", err=True)
    if refused:
        sys.exit(1)


@cache_group.command("verify")
@root_option
@json_option
def cache_verify(root: str | None, as_json: bool) -> None:
    """Read every fragment and snapshot; exit 1 if anything is damaged."""
    report = Store(root).verify()
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(f"fragments: {report.fragments}  rows: {report.rows}  "
                   f"duplicate rows: {report.duplicate_rows}")
        for path, reason in report.damaged:
            click.echo(f"damaged: {path}: {reason}")
        for path in report.stray_files:
            click.echo(f"stray file (ignored): {path}")
        for path in report.temporaries:
            click.echo(f"leftover temporary (removed by compact): {path}")
        for hw, snapshot in report.published.items():
            click.echo(f"published {hw}: {snapshot}")
        click.echo(f"wanted-list files: {report.wanted_files}  models: "
                   f"{', '.join(report.models) or '-'}")
        for problem in report.problems:
            click.echo(f"problem: {problem}")
        click.echo("ok" if report.ok else "DAMAGED")
    if not report.ok:
        sys.exit(1)


@cache_group.command("compact")
@root_option
@hw_id_option
@click.option("--op-kind", default=None, help="Only this op kind.")
@json_option
def cache_compact(root: str | None, hw_id: str | None, op_kind: str | None,
                  as_json: bool) -> None:
    """Merge small record fragments (safe while others read and write)."""
    result = Store(root).compact(hw_id, op_kind)
    if as_json:
        emit_json(asdict(result))
        return
    click.echo(f"partitions: {result.partitions}  fragments: {result.fragments_before} -> "
               f"{result.fragments_after}  records rewritten: {result.records}  "
               f"temporaries removed: {result.temporaries_removed}")


@cache_group.command("rollback")
@click.argument("hw_id")
@root_option
@click.option("--to", "to", default=None, metavar="SNAPSHOT",
              help="Snapshot name to make current (default: the one before the current).")
@json_option
def cache_rollback(hw_id: str, root: str | None, to: str | None, as_json: bool) -> None:
    """Make an older published snapshot of HW_ID current."""
    pointer = Store(root).rollback(hw_id, to)
    if as_json:
        emit_json({"hw_id": hw_id, **asdict(pointer)})
        return
    click.echo(f"{hw_id}: current snapshot is now {pointer.snapshot} ({pointer.entries} entries)")


@cache_group.command("export")
@click.argument("dest", type=click.Path(dir_okay=False))
@root_option
@hw_ids_option
@click.option("--records", is_flag=True,
              help="Export the measurement records instead of the published entries.")
@click.option("--format", "fmt", type=click.Choice(["parquet", "csv"]), default=None,
              help="Output format (default: from DEST's suffix, else parquet).")
@json_option
def cache_export(dest: str, root: str | None, hw_ids: tuple[str, ...], records: bool,
                 fmt: str | None, as_json: bool) -> None:
    """Write the current published entries (or the records) to one file DEST."""
    store = Store(root)
    if records:
        table = store.scan(hw_id=list(hw_ids) or None)
    else:
        tables = [store.read_snapshot(hw) for hw in (hw_ids or store.hardware())
                  if store.current(hw) is not None]
        table = pa.concat_tables(tables) if tables else None
        if table is None:
            from tunecache.cache.publish import SNAPSHOT_SCHEMA
            table = SNAPSHOT_SCHEMA.empty_table()
    fmt = fmt or ("csv" if dest.endswith(".csv") else "parquet")
    _write_export(table, Path(dest), fmt)
    summary = {"dest": dest, "rows": table.num_rows, "format": fmt,
               "what": "records" if records else "published"}
    if as_json:
        emit_json(summary)
    else:
        click.echo(f"wrote {table.num_rows} {summary['what']} rows to {dest} ({fmt})")


def _write_export(table: pa.Table, dest: Path, fmt: str) -> None:
    """Write ``table`` to ``dest``: a regular file through a temporary one renamed over it
    (never half-written), anything else (``/dev/stdout``, a pipe) as a stream. pyarrow
    deletes a path it failed to write, which must not happen to a device."""
    def write(sink: Any) -> None:
        if fmt == "csv":
            flat = {name: (_json_strings(col) if pa.types.is_list(col.type) else col)
                    for name, col in zip(table.column_names, table.columns, strict=True)}
            pacsv.write_csv(pa.table(flat), sink)
        else:
            pq.write_table(table, sink, compression="zstd")

    if dest.exists() and not dest.is_file():
        with open(dest, "wb") as stream:
            write(stream)
        return
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as stream:
            write(stream)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


@click.group("dataset")
def dataset_group() -> None:
    """The measurement records dataset."""


@dataset_group.command("show")
@root_option
@hw_id_option
@json_option
def dataset_show(root: str | None, hw_id: str | None, as_json: bool) -> None:
    """Summary of the records per hardware and op kind."""
    table = Store(root).scan(hw_id=hw_id, columns=[
        "hw_id", "op_kind", "status", "op_id", "schedule_id", "timestamp", "gflops"])
    rows = []
    if table.num_rows:
        df = table.to_pandas()
        for (hw, kind), part in df.groupby(["hw_id", "op_kind"], sort=True):
            ok = part[part["status"] == "ok"]
            rows.append({
                "hw_id": hw, "op_kind": kind, "records": len(part), "ok": len(ok),
                "failed": len(part) - len(ok), "ops": int(part["op_id"].nunique()),
                "schedules": int(part["schedule_id"].nunique()),
                "best_gflops": float(ok["gflops"].max()) if ok["gflops"].notna().any()
                else None,
                "first": part["timestamp"].min().isoformat(),
                "last": part["timestamp"].max().isoformat(),
            })
    if as_json:
        emit_json(rows)
        return
    click.echo(_table(rows, ["hw_id", "op_kind", "records", "ok", "failed", "ops",
                             "schedules", "best_gflops", "first", "last"]))


COMMANDS: list[click.Command] = [cache_group, dataset_group]
