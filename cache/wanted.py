"""The wanted list: ops that deployments looked up and missed, for the next nightly job.

Deploy-time compilation appends one small Parquet file per compile under
``wanted/hw_id=<hw_id>/`` (atomic, unique names, never modified: concurrent deployments
cannot lose each other's entries). ``tunecache tune --wanted`` reads them back aggregated per
op; ops tuned since are skipped by the job's usual "already tuned" rule, so nothing has to
be deleted.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tunecache.compiler.errors import TunecacheError
from tunecache.compiler.ops import OpSignature
from tunecache.datasets import fs
from tunecache.datasets.io import read_parquet_bytes
from tunecache.datasets.location import Location
from tunecache.datasets.paths import check_part, new_fragment_name

WANTED_DIR = "wanted"
WANTED_SCHEMA = pa.schema([
    pa.field("op_text", pa.string(), nullable=False),
    pa.field("count", pa.int64(), nullable=False),
    pa.field("model", pa.string()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
])


@dataclass(frozen=True, slots=True)
class WantedOp:
    """An op deployments asked for: total expected calls and the models that wanted it."""

    op: OpSignature
    count: int
    models: tuple[str, ...]


def _dir(hw_id: str) -> str:
    return f"{WANTED_DIR}/hw_id={check_part('hw_id', hw_id)}"


def add_wanted(loc: Location, hw_id: str, items: Iterable[tuple[OpSignature, int, str | None]]
               ) -> str | None:
    """Append ``(op, count, model)`` entries for ``hw_id``; the file written (None if empty)."""
    rows = list(items)
    if not rows:
        return None
    now = datetime.now(timezone.utc)
    table = pa.table({
        "op_text": [op.text for op, _, _ in rows],
        "count": [int(count) for _, count, _ in rows],
        "model": [model for _, _, model in rows],
        "timestamp": [now] * len(rows),
    }, schema=WANTED_SCHEMA)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return fs.write_atomic(loc, f"{_dir(hw_id)}/{new_fragment_name(now)}", sink.getvalue())


def load_wanted(loc: Location, hw_id: str) -> list[WantedOp]:
    """Every op wanted on ``hw_id``, counts summed, largest count first.

    Unreadable files and unparsable op texts are skipped (they are data from elsewhere).
    """
    totals: dict[str, int] = {}
    models: dict[str, set[str]] = {}
    for name in fs.list_names(loc, _dir(hw_id)):
        if name.startswith((".", "_")) or not name.endswith(".parquet"):
            continue
        data = fs.read_bytes(loc, f"{_dir(hw_id)}/{name}")
        if data is None:
            continue
        try:
            table = read_parquet_bytes(data, WANTED_SCHEMA)
        except (pa.ArrowException, OSError):
            continue
        for text, count, model in zip(table["op_text"].to_pylist(), table["count"].to_pylist(),
                                      table["model"].to_pylist(), strict=True):
            totals[text] = totals.get(text, 0) + int(count)
            if model:
                models.setdefault(text, set()).add(model)
    out: list[WantedOp] = []
    for text, count in totals.items():
        try:
            op = OpSignature.parse(text)
        except TunecacheError:
            continue
        out.append(WantedOp(op, count, tuple(sorted(models.get(text, ())))))
    out.sort(key=lambda w: (-w.count, w.op.text))
    return out


def _problem(data: bytes) -> str | None:
    """Why a wanted-list file's content is unusable (None when it is fine)."""
    try:
        table = read_parquet_bytes(data, WANTED_SCHEMA)
    except (pa.ArrowException, OSError) as exc:
        return f"unreadable: {exc}"
    if table.num_rows and pc.min(table["count"]).as_py() < 1:
        return "a count below 1"
    for text in pc.unique(table["op_text"]).to_pylist():
        try:
            OpSignature.parse(text)
        except TunecacheError as exc:
            return f"op text {text!r} does not parse: {exc}"
    return None


def verify_wanted(loc: Location) -> tuple[int, list[tuple[str, str]]]:
    """Read every wanted-list file: how many there are, and the damaged ones (path, reason).

    A file is damaged when it is not Parquet with the wanted-list columns, holds a count
    below 1 or an op text that does not parse; a directory not named ``hw_id=<id>`` is
    reported too. Hidden files (writers' temporaries) are left to ``verify``'s temporaries.
    """
    files = 0
    damaged: list[tuple[str, str]] = []
    for directory in fs.list_dirs(loc, WANTED_DIR):
        relative = f"{WANTED_DIR}/{directory}"
        hw_id = directory.removeprefix("hw_id=")
        try:
            check_part("hw_id", hw_id)
            if hw_id == directory:
                raise TunecacheError("not named hw_id=<hw_id>")
        except TunecacheError as exc:
            damaged.append((loc.path(relative), f"not a wanted-list directory: {exc}"))
            continue
        for name in fs.list_names(loc, relative):
            if name.startswith((".", "_")):
                continue
            files += 1
            path = f"{relative}/{name}"
            if not name.endswith(".parquet"):
                damaged.append((loc.path(path), "not a wanted-list file (*.parquet)"))
                continue
            try:
                data = fs.read_bytes(loc, path)
            except OSError as exc:
                damaged.append((loc.path(path), f"unreadable: {exc}"))
                continue
            reason = _problem(data) if data is not None else None
            if reason is not None:
                damaged.append((loc.path(path), reason))
    return files, damaged
