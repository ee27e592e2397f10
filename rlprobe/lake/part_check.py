"""Whether a stats part can be read as rows of its kind, so that a corrupt, truncated, empty or
foreign Parquet file under `stats/` is named, instead of surfacing as a DuckDB or Arrow error
deep inside a query ("Variable-length int over 10 bytes", a BinderException) or as rows of
nulls.

A part must have a readable footer, the columns that identify a row of its kind, and every other
column of the kind it has in the kind's type (or all null). Columns of the kind it lacks (a part
of an older version) read as null; columns the kind does not define (a newer version's) are kept.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rlprobe.lake.regular_files import PARQUET, NotRegularFileError, check_regular
from rlprobe.lake.schema import schema_for

# the columns that identify a row: a part without them holds no rows of that kind
ROW_KEYS = {
    "key_data": ("key", "step", "micro_step", "index"),
    "scalar": ("step", "name", "value"),
    "module": ("stage", "step", "module", "call", "direction", "io", "index", "seq"),
    "grad": ("monitor", "param", "step"),
    "param": ("monitor", "param", "step", "digest"),
    "module_param": ("stage", "step", "block", "module", "param", "digest"),
}


def part_problem(path: str | Path, kind: str, *, deep: bool = False) -> str | None:
    """None when the part at `path` reads as `kind` rows, else what is wrong, naming the file.
    The footer alone is read, unless `deep`: then every page (a corrupt data page shows only then). A FIFO
    or a device is not opened (Arrow would wait for a FIFO's writer; lake/regular_files.py)."""
    try:
        check_regular(path, PARQUET)
        schema = pq.read_table(path, partitioning=None).schema if deep else pq.read_schema(path)
    except NotRegularFileError as e:
        return unreadable_part(path, e.strerror)
    except (OSError, pa.ArrowException) as e:
        return unreadable_part(path, e)
    mismatch = schema_mismatch(schema, kind) if kind in ROW_KEYS else None  # another kind: only read
    if mismatch is None:
        return None
    return (f"{path}: not a {kind} stats part ({mismatch}; rlprobe's have {', '.join(ROW_KEYS[kind])} and its "
            f"other {kind} columns); move it out of the dump's stats/ folder")


def unreadable_part(path: str | Path, error: Exception | str) -> str:
    reason = " ".join(str(error).split())  # Arrow's messages run over several lines
    return f"{path}: unreadable Parquet part ({reason}); its rows are missing from this dump"


def schema_mismatch(schema: pa.Schema, kind: str) -> str | None:
    """Why columns `schema` are not rows of `kind` (see the module docstring), or None."""
    expected = schema_for(kind)
    missing = [c for c in ROW_KEYS[kind] if c not in schema.names]
    if missing:
        return f"no column {', '.join(repr(c) for c in missing)}"
    for field in schema:
        if field.name in expected.names and not _fits(field.type, expected.field(field.name).type):
            return f"column {field.name!r} is {field.type}, expected {expected.field(field.name).type}"
    return None


def conform(table: pa.Table, kind: str) -> pa.Table:
    """A part's table (schema_mismatch None) with every column of `kind` in the kind's type (a
    missing one as nulls), so the parts of a dump concatenate; other columns as they are."""
    expected = schema_for(kind)
    for field in expected:
        if field.name not in table.column_names:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
        elif table.schema.field(field.name).type != field.type:
            i = table.column_names.index(field.name)
            table = table.set_column(i, field, table.column(i).cast(field.type))
    return table


def _fits(found: pa.DataType, expected: pa.DataType) -> bool:
    if found == expected or pa.types.is_null(found):
        return True
    if pa.types.is_dictionary(found):
        return _fits(found.value_type, expected)
    if pa.types.is_string(expected):
        return pa.types.is_large_string(found)
    if pa.types.is_list(expected):
        return (pa.types.is_list(found) or pa.types.is_large_list(found)) and _fits(found.value_type,
                                                                                    expected.value_type)
    return False
