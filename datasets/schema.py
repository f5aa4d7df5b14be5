"""The canonical Arrow schema of tuning records (version 2).

One row per measurement, failures included. The schema only ever grows by nullable columns
and never changes a column's type, so files written by older versions keep loading: missing
columns read as null. ``schema_version`` is stored both as a column and in the Parquet file
key-value metadata (``tunecache.schema_version``).

The columns are of two sorts:

* **fixed** columns (:data:`FIXED_COLUMNS`): identity, hardware, op ids, ``schedule_json`` /
  ``schedule_id``, toolchain, outcome and provenance; every kind fills the same ones.
* **derived** columns, one per dim and per schedule knob of the registered op kinds
  (:func:`tunecache.compiler.kinds.all_kinds`): each kind's ``dim_columns`` names the column
  of each of its dims (int64), and each registered schedule class's knobs
  (:func:`tunecache.compiler.schedule.knob_types`) give a column of the knob's name (int32
  for integer knobs, string for text ones). Kinds share columns by naming the same one (every
  family's ``threads``, ``dim_m`` of matmul and softmax); a column must keep one meaning, so
  a derived column named like a fixed one, a column that is a dim of one kind and a knob of
  another, or a knob whose type differs between families makes importing this module fail
  with :class:`SchemaError`.

Column order: the version 1 columns first, in their version 1 order and with their version
1 types (:data:`V1_COLUMNS`; they include the columns of the kinds registered then, matmul,
batch_matmul and conv2d), then every other derived column in kind order: builtin kinds in
``BUILTIN_KINDS`` order, then entry-point kinds by name, each kind's dim columns before its
knob columns. The schema is therefore fixed when this module is first imported, by the
builtin kinds plus the ``tunecache.kinds`` entry points installed; a kind registered later
has no columns (``Record.create`` refuses it). Processes with different kind plug-ins write
different column sets, which stays readable both ways: readers drop columns they do not
know and read missing ones as null.

``hw_id`` and ``op_kind`` are the hive partition keys of the store
(``records/hw_id=…/op_kind=…/``). Like every hive-partitioned dataset, the fragment files do
not repeat them as columns, so plain ``pd.read_parquet(root + "/records")`` works; the
readers in :mod:`tunecache.datasets.io` add them back from the path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from tunecache.compiler.kinds import BUILTIN_KINDS, OpKind, all_kinds
from tunecache.compiler.schedule import knob_types
from tunecache.datasets.errors import SchemaError

SCHEMA_VERSION = 2
SCHEMA_VERSION_KEY = b"tunecache.schema_version"

STATUSES = ("ok", "compile_error", "runtime_error", "wrong_result", "timeout", "invalid")
"""Every measurement outcome. Only ``ok`` rows carry a trustworthy latency."""

PARTITION_COLUMNS = ("hw_id", "op_kind")

_S = pa.string()
_I32 = pa.int32()
_I64 = pa.int64()
_F64 = pa.float64()

DIM_TYPE = _I64
"""The type of a derived dim column (version 1 conv2d parameter columns stay int32)."""
KNOB_TYPES: dict[type, pa.DataType] = {int: _I32, str: _S}
"""The type of a derived knob column, by the knob's Python type."""


def _ints(type_: pa.DataType, *names: str) -> list[pa.Field]:
    return [pa.field(name, type_) for name in names]


V1_COLUMNS: tuple[pa.Field, ...] = (
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
    *_ints(_I64, "dim_batch", "dim_m", "dim_n", "dim_k"),
    # schedule
    pa.field("schedule_json", _S),
    pa.field("schedule_id", _S),
    *_ints(_I32, "mr", "nr", "kc", "mc", "nc", "pack_a", "pack_b"),
    pa.field("loop_order", _S),
    *_ints(_I32, "unroll", "threads"),
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
    # conv2d (added during version 1)
    *_ints(_I64, "dim_c", "dim_h", "dim_w", "dim_f", "dim_r", "dim_s"),
    *_ints(_I32, "stride_h", "stride_w", "pad_t", "pad_l", "pad_b", "pad_r", "dil_h", "dil_w",
           "groups"),
    pa.field("algorithm", _S),
    *_ints(_I32, "oc_block", "ow_block", "oh_block", "ic_block", "unroll_kw", "pack_w"),
)
"""The version 1 columns, frozen: their names, order and types never change."""

ADDED_FIXED_COLUMNS: tuple[pa.Field, ...] = (
    # The op's dtype (float32, int8, bf16; issue 53), for analysts: null in files written
    # before it, whose ops were all float32 (the readers fill that in).
    pa.field("op_dtype", _S),
)
"""Fixed columns added since version 1, after the version 1 columns, in the order added."""

FIXED_COLUMNS: tuple[str, ...] = (
    "record_id", "timestamp", "schema_version", "hw_id", "hw_isa", "hw_cores", "hw_cpu_model",
    "hw_json", "op_kind", "op_id", "op_text", "schedule_json", "schedule_id", "compiler",
    "flags", "codegen_version", "source_hash", "status", "error", "runtimes_s", "median_s",
    "min_s", "gflops", "compile_s", "job_id", "host", "source", "predicted", "model_version",
    *(f.name for f in ADDED_FIXED_COLUMNS),
)
"""Columns every kind fills the same way (in schema order); all others are derived."""


@dataclass(frozen=True)
class RecordLayout:
    """The record schema of a set of kinds, and which derived columns are dims and knobs."""

    schema: pa.Schema
    dim_columns: tuple[str, ...]
    knob_columns: tuple[str, ...]


def _ordered(kinds: Iterable[OpKind]) -> list[OpKind]:
    rank = {name: i for i, name in enumerate(BUILTIN_KINDS)}
    return sorted(kinds, key=lambda k: (rank.get(k.name, len(rank)), k.name))


def _claims(kinds: Iterable[OpKind]) -> dict[str, tuple[str, str, pa.DataType]]:
    """Derived column -> (dim/knob, who claims it, Arrow type), checking one meaning each."""
    fixed = set(FIXED_COLUMNS)
    claims: dict[str, tuple[str, str, pa.DataType]] = {}

    def claim(column: str, role: str, owner: str, type_: pa.DataType) -> None:
        if column in fixed:
            raise SchemaError(f"{owner} names its {role} column {column!r}, which is a fixed "
                              f"record column; fixed columns: {', '.join(FIXED_COLUMNS)}")
        other = claims.get(column)
        if other is None:
            claims[column] = (role, owner, type_)
        elif other[0] != role:
            raise SchemaError(f"record column {column!r} is a {other[0]} of {other[1]} and "
                              f"a {role} of {owner}; a column must have one meaning")
        elif other[2] != type_:
            raise SchemaError(f"knob {column!r} is {other[2]} in {other[1]} but {type_} in "
                              f"{owner}; a knob name shared by families needs one type")

    for kind in kinds:
        for column in kind.dim_columns.values():
            claim(column, "dim", f"kind {kind.name!r}", DIM_TYPE)
        owner = f"schedule family {kind.schedule.family!r}"
        for name, py_type in knob_types(kind.schedule).items():
            claim(name, "knob", owner, KNOB_TYPES[py_type])
    return claims


def _same_sort(a: pa.DataType, b: pa.DataType) -> bool:
    return (pa.types.is_integer(a) and pa.types.is_integer(b)) or a == b


def build_layout(kinds: Iterable[OpKind]) -> RecordLayout:
    """The record schema for ``kinds``: :data:`V1_COLUMNS`, the fixed columns added since
    (:data:`ADDED_FIXED_COLUMNS`), then the new derived columns.

    Raises :class:`SchemaError` when two kinds give a column different meanings or types,
    or a derived column is named like a fixed one or clashes with a version 1 column's type.
    """
    kinds = _ordered(kinds)
    claims = _claims(kinds)
    v1 = {f.name: f for f in V1_COLUMNS}
    for column, (role, owner, type_) in claims.items():
        old = v1.get(column)
        if old is not None and not _same_sort(old.type, type_):
            raise SchemaError(f"{owner} needs {role} column {column!r} as {type_}, but the "
                              f"record schema has it as {old.type}")
    fields = [*V1_COLUMNS, *ADDED_FIXED_COLUMNS,
              *(pa.field(column, type_) for column, (_, _, type_) in claims.items()
                if column not in v1)]
    schema = pa.schema(fields, metadata={SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()})
    roles = {column: role for column, (role, _, _) in claims.items()}
    return RecordLayout(
        schema,
        tuple(n for n in schema.names if roles.get(n) == "dim"),
        tuple(n for n in schema.names if roles.get(n) == "knob"),
    )


LAYOUT = build_layout(all_kinds())

SCHEMA: pa.Schema = LAYOUT.schema
"""The canonical record schema, partition columns included."""

COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)
REQUIRED_COLUMNS: tuple[str, ...] = tuple(f.name for f in SCHEMA if not f.nullable)
DERIVED_COLUMNS: tuple[str, ...] = tuple(n for n in COLUMNS if n not in FIXED_COLUMNS)
"""Every non-fixed column, in schema order (those of the version 1 kinds included)."""
DIM_COLUMNS: tuple[str, ...] = LAYOUT.dim_columns
"""Every column a registered kind stores a dim in, in schema order."""
KNOB_COLUMNS: tuple[str, ...] = LAYOUT.knob_columns
"""Every column a registered schedule family stores a knob in, in schema order."""

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


COLUMN_DEFAULTS: dict[str, str] = {"op_dtype": "float32"}
"""What a column added later holds in rows written before it: every op was float32."""


def conform(table: pa.Table, schema: pa.Schema = SCHEMA) -> pa.Table:
    """Return ``table`` with exactly ``schema``'s columns, in order and with its types.

    Missing nullable columns become nulls (older files; those with a
    :data:`COLUMN_DEFAULTS` value read as it), unknown columns are dropped (newer files),
    other types are cast safely. Raises :class:`SchemaError` when a required column is
    missing or null, or a column cannot be cast.
    """
    columns: list[pa.ChunkedArray | pa.Array] = []
    for field in schema:
        if field.name not in table.column_names:
            if not field.nullable:
                raise SchemaError(f"required column {field.name!r} is missing")
            default = COLUMN_DEFAULTS.get(field.name)
            columns.append(pa.nulls(table.num_rows, field.type) if default is None
                           else pa.array([default] * table.num_rows, field.type))
            continue
        column = table.column(field.name)
        if field.name in COLUMN_DEFAULTS and column.null_count:
            column = pc.fill_null(column, COLUMN_DEFAULTS[field.name])
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
