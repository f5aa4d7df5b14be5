"""The canonical Arrow schema of tuning records (version 1).

One row per measurement, failures included. The schema only ever grows by nullable columns
and never changes a column's type, so files written by older versions keep loading: missing
columns read as null. ``schema_version`` is stored both as a column and in the Parquet file
key-value metadata (``tunecache.schema_version``).

``hw_id`` and ``op_kind`` are the hive partition keys of the store
(``records/hw_id=…/op_kind=…/``). Like every hive-partitioned dataset, the fragment files do
not repeat them as columns, so plain ``pd.read_parquet(root + "/records")`` works; the
readers in :mod:`tunecache.datasets.io` add them back from the path.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from tunecache.datasets.errors import SchemaError

SCHEMA_VERSION = 1
SCHEMA_VERSION_KEY = b"tunecache.schema_version"

STATUSES = ("ok", "compile_error", "runtime_error", "wrong_result", "timeout", "invalid")
"""Every measurement outcome. Only ``ok`` rows carry a trustworthy latency."""

PARTITION_COLUMNS = ("hw_id", "op_kind")
KNOB_COLUMNS = ("mr", "nr", "kc", "mc", "nc", "pack_a", "pack_b", "unroll", "threads")
KNOB_TEXT_COLUMNS = ("loop_order", "parallel")
DIM_COLUMNS = {"B": "dim_batch", "M": "dim_m", "N": "dim_n", "K": "dim_k"}
"""Op dim -> column for matmul and batch_matmul."""
CONV_DIM_COLUMNS = {
    "N": "dim_batch", "C": "dim_c", "H": "dim_h", "W": "dim_w", "F": "dim_f", "R": "dim_r",
    "S": "dim_s", "stride_h": "stride_h", "stride_w": "stride_w", "pad_t": "pad_t",
    "pad_l": "pad_l", "pad_b": "pad_b", "pad_r": "pad_r", "dil_h": "dil_h", "dil_w": "dil_w",
    "groups": "groups",
}
"""Op dim -> column for conv2d (its batch N goes to ``dim_batch``, not ``dim_n``)."""
CONV_KNOB_COLUMNS = ("oc_block", "ow_block", "oh_block", "ic_block", "unroll_kw", "pack_w")
"""Integer conv2d knob columns; ``algorithm`` is text, and conv2d schedules also fill the
shared ``loop_order``, ``threads`` and ``parallel`` columns."""


def dim_columns(kind: str) -> dict[str, str]:
    """Which column each dim of an op of ``kind`` is stored in."""
    return CONV_DIM_COLUMNS if kind == "conv2d" else DIM_COLUMNS

_S = pa.string()
_I32 = pa.int32()
_I64 = pa.int64()
_F64 = pa.float64()

_FIELDS: list[pa.Field] = [
    # identity
    pa.field("record_id", _S, nullable=False),
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("schema_version", pa.int16(), nullable=False),
    # hardware
    pa.field("hw_id", _S, nullable=False),
    pa.field("hw_isa", _S),
    pa.field("hw_cores", _I32),
    pa.field("hw_cpu_model", _S),
    pa.field("hw_json", _S),
    # op
    pa.field("op_kind", _S, nullable=False),
    pa.field("op_id", _S, nullable=False),
    pa.field("op_text", _S, nullable=False),
    pa.field("dim_batch", _I64),
    pa.field("dim_m", _I64),
    pa.field("dim_n", _I64),
    pa.field("dim_k", _I64),
    # schedule
    pa.field("schedule_json", _S),
    pa.field("schedule_id", _S),
    *(pa.field(name, _I32) for name in KNOB_COLUMNS[:7]),
    pa.field("loop_order", _S),
    pa.field("unroll", _I32),
    pa.field("threads", _I32),
    pa.field("parallel", _S),
    # toolchain
    pa.field("compiler", _S),
    pa.field("flags", _S),
    pa.field("codegen_version", _S),
    pa.field("source_hash", _S),
    # outcome
    pa.field("status", _S, nullable=False),
    pa.field("error", _S),
    pa.field("runtimes_s", pa.list_(_F64)),
    pa.field("median_s", _F64),
    pa.field("min_s", _F64),
    pa.field("gflops", _F64),
    pa.field("compile_s", _F64),
    # provenance
    pa.field("job_id", _S),
    pa.field("host", _S),
    pa.field("source", _S),
    pa.field("predicted", _F64),
    pa.field("model_version", _S),
    # conv2d (added after v1's first release: nullable, null for other kinds and older files)
    *(pa.field(name, _I64) for name in ("dim_c", "dim_h", "dim_w", "dim_f", "dim_r", "dim_s")),
    *(pa.field(name, _I32) for name in ("stride_h", "stride_w", "pad_t", "pad_l", "pad_b",
                                        "pad_r", "dil_h", "dil_w", "groups")),
    pa.field("algorithm", _S),
    *(pa.field(name, _I32) for name in CONV_KNOB_COLUMNS),
]

SCHEMA: pa.Schema = pa.schema(
    _FIELDS, metadata={SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()}
)
"""The canonical record schema, partition columns included."""

COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)
REQUIRED_COLUMNS: tuple[str, ...] = tuple(f.name for f in SCHEMA if not f.nullable)

FILE_SCHEMA: pa.Schema = pa.schema(
    [f for f in SCHEMA if f.name not in PARTITION_COLUMNS], metadata=SCHEMA.metadata
)
"""The schema of one fragment file: the canonical schema less the partition columns."""


def file_schema_version(metadata: dict[bytes, bytes] | None) -> int | None:
    """The schema version recorded in a Parquet file's key-value metadata, if any."""
    if not metadata or SCHEMA_VERSION_KEY not in metadata:
        return None
    try:
        return int(metadata[SCHEMA_VERSION_KEY])
    except ValueError:
        return None


def conform(table: pa.Table, schema: pa.Schema = SCHEMA) -> pa.Table:
    """Return ``table`` with exactly ``schema``'s columns, in order and with its types.

    Missing nullable columns become nulls (older files), unknown columns are dropped (newer
    files), other types are cast safely. Raises :class:`SchemaError` when a required column is
    missing or null, or a column cannot be cast.
    """
    columns: list[pa.ChunkedArray | pa.Array] = []
    for field in schema:
        if field.name not in table.column_names:
            if not field.nullable:
                raise SchemaError(f"required column {field.name!r} is missing")
            columns.append(pa.nulls(table.num_rows, field.type))
            continue
        column = table.column(field.name)
        if not field.nullable and column.null_count:
            raise SchemaError(f"required column {field.name!r} has {column.null_count} null(s)")
        if column.type != field.type:
            try:
                if pa.types.is_dictionary(column.type):
                    column = column.cast(column.type.value_type)
                column = pc.cast(column, field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaError(
                    f"column {field.name!r} has type {column.type}, which cannot be read as "
                    f"{field.type}: {exc}"
                ) from None
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)
