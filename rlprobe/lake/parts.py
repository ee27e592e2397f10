"""Stats parts of one (kind, rank): append a part per flush, merge them so few files remain.

Merging is size-tiered: whenever the newest FANOUT parts are of one tier (tier = log base
FANOUT of the number of flushes a part covers), they become one part. A rank therefore keeps
at most FANOUT-1 parts per tier, a handful for any run length, and `merge_all` leaves one.
The merged part is renamed into place before the parts it replaces are removed; readers
ignore parts covered by a wider one, so a kill between the two steps double-counts nothing.

Then whether a stats part can be read as rows of its kind (conform, unreadable_part), so that a corrupt,
truncated, empty or foreign Parquet file under `stats/` is named, instead of surfacing as a DuckDB or Arrow error
deep inside a query ("Variable-length int over 10 bytes", a BinderException) or as rows of nulls. A part must
have a readable footer, the columns that identify a row of its kind, and every other column of the kind it has
in the kind's type (or all null). Columns of the kind it lacks (a part of an older version) read as null;
columns the kind does not define (a newer version's) are kept.
"""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rlprobe.lake.atomic import atomic_write_parquet, is_temporary
from rlprobe.lake.layout import Part, live_parts_in, part_name, parts_in
from rlprobe.lake.regular_files import PARQUET, NotRegularFileError, check_regular
from rlprobe.lake.schema import schema_for

# 8, not 4: a merge's fixed costs (a Parquet file written, renamed, its inputs removed) come half as often
# a commit, and a row is rewritten log8 instead of log4 times (~13 ms a commit of TRL's example at 4,
# a third of it merges; docs/trl.md); a rank keeps up to 7 parts a tier instead of 3
FANOUT = 8
# tables of parts this store wrote stay in memory (up to this many bytes in all), so a tiered
# merge concatenates them instead of reading its own small files back
CACHE_BYTES = 16 << 20


def _tier(part: Part) -> int:
    return int(math.log(part.size, FANOUT) + 1e-9)


class PartStore:
    def __init__(self, directory: Path):
        self.directory = directory
        self.next_seq = max((p.last for p in parts_in(directory)), default=-1) + 1
        self._cache: dict[Path, tuple[pa.Table, int]] = {}  # with its buffers' size
        self._cache_bytes = 0
        self._disk_schemas: dict[pa.Schema, pa.Schema] = {}

    def _remember(self, path: Path, table: pa.Table) -> None:
        # the buffers' total size, not Table.nbytes: that one works out which bytes of each buffer
        # are referenced, milliseconds for a table of many small chunks (a commit's parts)
        nbytes = table.get_total_buffer_size()
        if self._cache_bytes + nbytes > CACHE_BYTES:
            return
        try:  # as a read would return it (Parquet names list items "element", say)
            disk = self._disk_schemas.get(table.schema)
            if disk is None:
                disk = self._disk_schemas[table.schema] = pq.read_schema(path)
            try:
                table = pa.Table.from_arrays(table.columns, schema=disk)  # no copy
            except (TypeError, ValueError, pa.ArrowException):
                table = table.cast(disk)
        except (OSError, TypeError, ValueError, pa.ArrowException):
            return  # read it back when merging
        self._cache[path] = (table, nbytes)
        self._cache_bytes += nbytes

    def _forget(self, path: Path) -> None:
        cached = self._cache.pop(path, None)
        if cached is not None:
            self._cache_bytes -= cached[1]

    def _read(self, path: Path) -> pa.Table:
        cached = self._cache.get(path)
        if cached is not None:
            return cached[0]
        check_regular(path, PARQUET)  # a FIFO would keep Arrow waiting (lake/regular_files.py)
        with pq.ParquetFile(path) as f:
            return f.read()

    def live(self) -> list[Part]:
        return live_parts_in(self.directory)[0]

    def append(self, table: pa.Table) -> Part:
        """Write `table` as the next part; returns it. Raises OSError on I/O failure."""
        seq = self.next_seq
        path = self.directory / part_name(seq, seq)
        table = _one_chunk(table)
        atomic_write_parquet(path, table)
        self.next_seq = seq + 1
        self._remember(path, table)
        return Part(path, seq, seq)

    def merge_tiered(self) -> None:
        while True:
            live = self.live()
            if len(live) < FANOUT:
                return
            tail = live[-FANOUT:]
            if len({_tier(p) for p in tail}) != 1:
                return
            self._merge(tail)

    def merge_all(self) -> None:
        live = self.live()
        if len(live) > 1:
            self._merge(live)
        self.remove_leftovers()

    def remove_leftovers(self) -> None:
        """Delete parts already covered by a merged part and temporaries of killed writers."""
        if not self.directory.is_dir():
            return
        for p in live_parts_in(self.directory)[1]:
            self._forget(p.path)
            p.path.unlink(missing_ok=True)
        for f in self.directory.iterdir():
            if is_temporary(f):
                f.unlink(missing_ok=True)

    def drop_rows_outside(self, steps: set[int], column: str = "step") -> tuple[int, list[str]]:
        """Remove rows whose `column` is not one of `steps` (a killed writer's uncommitted rows),
        rewriting each affected part atomically. Returns (rows removed, the tensor and sign
        files those rows named, relative to the dump root)."""
        import pyarrow.compute as pc

        self.remove_leftovers()
        dropped = 0
        files: list[str] = []
        keep_steps = pa.array(sorted(steps), pa.int64())
        for part in self.live():
            self._forget(part.path)
            check_regular(part.path, PARQUET)
            table = pq.read_table(part.path, partitioning=None)
            if column not in table.column_names:
                continue
            keep = pc.fill_null(pc.is_in(table[column], value_set=keep_steps), True)
            kept = table.filter(keep)
            if kept.num_rows == table.num_rows:
                continue
            gone = table.filter(pc.invert(keep))
            for name in ("tensor_file", "sign_file"):
                if name in gone.column_names:
                    files.extend(f for f in set(gone[name].to_pylist()) if f)
            dropped += table.num_rows - kept.num_rows
            if kept.num_rows:
                atomic_write_parquet(part.path, kept)
            else:
                part.path.unlink(missing_ok=True)
        return dropped, files

    def _merge(self, parts: list[Part]) -> None:
        tables = [self._read(p.path) for p in parts]
        merged = _one_chunk(pa.concat_tables(tables, promote_options="default"))
        if "step" in merged.column_names and not _ascending(merged["step"]):
            merged = merged.sort_by([("step", "ascending")])  # stable: keeps flush order within a step
        path = self.directory / part_name(parts[0].first, parts[-1].last)
        atomic_write_parquet(path, merged)
        for p in parts:
            self._forget(p.path)
            p.path.unlink(missing_ok=True)
        self._remember(path, merged)


def _one_chunk(table: pa.Table) -> pa.Table:
    """`table` with each column in one chunk (a commit's sample rows come as a table per save call, a
    merge's as a table per part): written so (atomic_write_parquet would combine its own copy) and kept
    so for the next merge, whose concatenation and step check then see a few chunks, not hundreds."""
    return table.combine_chunks() if any(c.num_chunks > 1 for c in table.columns) else table


def _ascending(steps: pa.ChunkedArray) -> bool:
    """Whether `steps` never decrease and hold no null: parts merged in flush order usually do, and
    sorting them anyway took every column through a `take` (8 % of the writer's CPU in a TRL-like run of
    a commit every 11 steps; docs/trl.md, "Tenth pass")."""
    if steps.null_count or not pa.types.is_integer(steps.type):
        return False
    values = steps.chunk(0).to_numpy() if steps.num_chunks == 1 else steps.to_numpy()
    return bool((values[1:] >= values[:-1]).all())


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
