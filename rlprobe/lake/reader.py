"""Open a dump for reading: polars LazyFrames, numpy tensors and a DuckDB connection.

rlprobe dumps and msprobe dumps look the same from here: msprobe's JSON statistics become
key_data rows (dtype and counts unknown), its configurations.json the configs table.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rlprobe.errors import DumpReadError
from rlprobe.lake import msprobe_format, msprobe_scan
from rlprobe.lake.configs import configs_as_table, read_configs, read_json
from rlprobe.lake.encoding import restore
from rlprobe.lake.layout import RUN_MANIFEST, DumpLayout
from rlprobe.lake.msprobe_format import rlprobe_unread, warn_unread
from rlprobe.lake.schema import schema_for, step_column, with_rank
from rlprobe.lake.tensor_pack import read_tensor_file

if TYPE_CHECKING:
    import duckdb
    import polars as pl

_DUCKDB_TYPES = {"string": "VARCHAR", "int64": "BIGINT", "double": "DOUBLE", "bool": "BOOLEAN",
                 "list<item: int64>": "BIGINT[]", "list<item: double>": "DOUBLE[]"}
VIEWS = {"key_data": "key_data", "scalars": "scalar"}


def open_dump(path: Any, include_uncommitted: bool = False) -> "Dump":
    if not isinstance(path, (str, Path)) and not hasattr(path, "__fspath__"):
        raise DumpReadError(f"dump path {path!r}: expected a directory path (str or os.PathLike)")
    root = Path(path)
    if not root.exists():
        raise DumpReadError(f"dump {root} does not exist")
    if not root.is_dir():
        raise DumpReadError(f"dump {root} is a file; expected a dump directory (rlprobe or msprobe)")
    if (root / RUN_MANIFEST).exists() or (root / "stats").is_dir() or any(root.glob("rank*.json")):
        warn_unread(root, rlprobe_unread(root), "rlprobe")  # what its readers list and leave out: named
        return Dump(root, "rlprobe", include_uncommitted)
    if msprobe_format.is_msprobe_key_data(root):
        return Dump(root, "msprobe")
    if msprobe_format.is_msprobe_grad(root):
        return Dump(root, "msprobe-grad")
    raise DumpReadError(
        f"{root} is not a dump: expected rlprobe.json and stats/ (rlprobe), data/<key>/step<S>/... "
        "(msprobe SingleSave) or rank<R>/grad_summary_<S>.csv (msprobe grad_probe)"
    )


class Dump:
    """A dump on disk, read-only.

    Stats rows of rlprobe dumps are shown for committed steps only (each rank's
    `committed_steps`): rows a killed writer left of later steps, and rows of a rank whose
    manifest is missing, appear only with `include_uncommitted=True`."""

    def __init__(self, root: Path, fmt: str, include_uncommitted: bool = False):
        self.path = root
        self.format = fmt
        self.include_uncommitted = include_uncommitted
        self.layout = DumpLayout(root)
        self._listing: "msprobe_scan.TensorListing | None" = None  # msprobe_tensor_files
        self.reading_ahead = msprobe_scan.ReadAhead(self.path)  # its statistics in a second process, if started

    def __repr__(self) -> str:
        extra = ", include_uncommitted=True" if self.include_uncommitted else ""
        return f"Dump({str(self.path)!r}, format={self.format!r}{extra})"

    # -- manifests -----------------------------------------------------------------------
    @cached_property
    def manifest(self) -> dict[str, Any]:
        return read_json(self.layout.run_manifest, True) if self.format == "rlprobe" else {"format": self.format}

    @cached_property
    def rank_manifests(self) -> dict[int, dict[str, Any]]:
        if self.format != "rlprobe":
            return {}
        found = {}
        for f in self.path.glob("rank*.json"):
            try:
                found[int(f.stem[4:])] = read_json(f, versioned=True)
            except ValueError:
                continue
        return dict(sorted(found.items()))

    @property
    def complete(self) -> bool | None:
        """True when every rank 0..world_size-1 closed its probe; None for msprobe dumps (unknown)."""
        if self.format != "rlprobe":
            return None
        world = self.manifest.get("world_size") or max(self.rank_manifests, default=-1) + 1
        if not isinstance(world, int) or world < 1:
            return False
        return all(self.rank_manifests.get(r, {}).get("closed") for r in range(world))

    def committed_ranges(self, rank: int) -> list[tuple[int, int]]:
        """Rank `rank`'s committed steps as sorted, disjoint (first, last) ranges; none when its manifest is missing."""
        cache = self.__dict__.setdefault("_ranges", {})
        if rank not in cache:
            steps = self.rank_manifests.get(rank, {}).get("committed_steps") or []
            ranges: list[tuple[int, int]] = []
            for step in sorted({s for s in steps if isinstance(s, int) and not isinstance(s, bool)}):
                if ranges and step == ranges[-1][1] + 1:
                    ranges[-1] = (ranges[-1][0], step)
                else:
                    ranges.append((step, step))
            cache[rank] = ranges
        return cache[rank]

    def hides_rows_of(self, rank: int) -> bool:
        """Whether rank `rank`'s rows are filtered by its committed steps. A rank that closed
        without incomplete steps committed every row it wrote (docs/dump-format.md), so only a
        killed or failed rank, or one without a manifest, costs the filter."""
        if self.format != "rlprobe" or self.include_uncommitted:
            return False
        manifest = self.rank_manifests.get(rank)
        return manifest is None or not manifest.get("closed") or bool(manifest.get("incomplete_steps"))

    def committed_table(self, kind: str) -> pa.Table:
        """(rank, first_step, last_step): the committed step ranges of every filtered rank with
        `kind` parts (a rank with none has one row of nulls); ranks not listed show every row."""
        rows = []
        for rank in self.parts(kind):
            if self.hides_rows_of(rank):
                rows.extend((rank, lo, hi) for lo, hi in self.committed_ranges(rank) or [(None, None)])
        return pa.table({"rank": pa.array([r[0] for r in rows], pa.int64()),
                         "first_step": pa.array([r[1] for r in rows], pa.int64()),
                         "last_step": pa.array([r[2] for r in rows], pa.int64())})

    def _visible_mask(self, table: pa.Table, kind: str, rank: int) -> pa.Array | None:
        """Which rows of one rank's table belong to committed steps (None: all of them)."""
        import pyarrow.compute as pc

        column = step_column(kind)
        if not self.hides_rows_of(rank) or column not in table.column_names:
            return None
        steps = table[column]
        mask = pa.array([False] * table.num_rows, pa.bool_())
        for lo, hi in self.committed_ranges(rank):
            mask = pc.or_(mask, pc.and_(pc.greater_equal(steps, lo), pc.less_equal(steps, hi)))
        return pc.fill_null(mask, False)

    # -- stats ---------------------------------------------------------------------------
    def parts(self, kind: str) -> dict[int, list[str]]:
        """Live Parquet parts per rank for a stats kind."""
        found: dict[int, list[str]] = {}
        for part in self.layout.live_parts(kind):
            rank = int(part.path.parent.name[5:])
            found.setdefault(rank, []).append(str(part.path))
        return found

    def checked_parts(self, kind: str, errors: list[str] | None = None, *, deep: bool = False) -> dict[int, list[str]]:
        """`parts(kind)` that read as `kind` rows (rlprobe.lake.parts): a corrupt, truncated,
        empty or foreign part raises DumpReadError naming it or, with `errors` given, is described
        there and left out. Only footers are read, unless `deep` (every page: slow, for diagnosis)."""
        from rlprobe.lake.parts import part_problem

        found: dict[int, list[str]] = {}
        for rank, files in self.parts(kind).items():
            for f in files:
                problem = part_problem(f, kind, deep=deep)
                if problem is None:
                    found.setdefault(rank, []).append(f)
                elif errors is None:
                    raise DumpReadError(problem)
                else:
                    errors.append(problem)
        return found

    def check_every_page(self) -> None:
        """Read every stats part whole; DumpReadError names the first that cannot be read (a corrupt
        data page, which DuckDB reports without the file: call this after a query failed)."""
        from rlprobe.lake.layout import KINDS

        for kind in KINDS:
            self.checked_parts(kind, deep=True)

    def arrow(self, kind: str, errors: list[str] | None = None) -> pa.Table:
        """A whole stats table with its rank column (ValueError for a kind lake/schema.py does not know). With `errors`,
        a part that cannot be read as `kind` rows is skipped and described there instead of raising DumpReadError."""
        schema_for(kind)  # a typo was an empty table
        if self.format == "msprobe":
            return self._msprobe_key_data if kind == "key_data" else _empty(kind)
        if self.format == "msprobe-grad":
            return self._msprobe_grad if kind == "grad" else _empty(kind)
        from rlprobe.lake.parts import conform, unreadable_part

        tables = []
        for rank, files in self.checked_parts(kind, errors).items():
            for f in files:
                try:
                    t = conform(pq.read_table(f, partitioning=None), kind)
                except (OSError, pa.ArrowException) as e:
                    message = unreadable_part(f, e)
                    if errors is None:
                        raise DumpReadError(message) from None
                    errors.append(message)
                    continue
                mask = self._visible_mask(t, kind, rank)
                if mask is not None:
                    t = t.filter(mask)
                tables.append(t.append_column("rank", pa.array([rank] * t.num_rows, pa.int64())))
        if not tables:
            return _empty(kind)
        return pa.concat_tables(tables, promote_options="default")

    def msprobe_tensor_files(self) -> list[str]:
        """An msprobe dump's tensor files, relative to it, in arrow("key_data")'s order (OSError: a folder not listed)."""
        if self.format != "msprobe":
            return []
        if "_msprobe_key_data" in self.__dict__:
            return self._msprobe_key_data["tensor_file"].to_pylist()
        self._listing = self._listing or msprobe_scan.list_tensors(str(self.path))
        return self._listing.columns["tensor_file"]

    @cached_property
    def _msprobe_key_data(self) -> pa.Table:  # read once; reading_ahead's columns, where it read them, else read here
        listing, self._listing = self._listing, None
        return msprobe_format.key_data_table(self.path, listing, self.reading_ahead.take())

    @cached_property
    def _msprobe_grad(self) -> pa.Table:  # read once: a summary CSV per rank and step
        return msprobe_format.grad_table(self.path)

    def _lazy(self, kind: str) -> "pl.LazyFrame":
        import polars as pl

        if self.format == "rlprobe":
            frames = []
            for rank, files in self.checked_parts(kind).items():
                frame = pl.scan_parquet(files, hive_partitioning=False)
                if self.hides_rows_of(rank):
                    column = pl.col(step_column(kind))
                    visible = pl.lit(False)
                    for lo, hi in self.committed_ranges(rank):
                        visible = visible | column.is_between(lo, hi)
                    frame = frame.filter(visible)
                frames.append(frame.with_columns(pl.lit(rank, pl.Int64).alias("rank")))
            if frames:
                return pl.concat(frames, how="diagonal_relaxed")
        return pl.from_arrow(self.arrow(kind)).lazy()

    def key_data(self) -> "pl.LazyFrame":
        """Key-data statistics, one row per (key, step, rank, micro_step, index)."""
        return self._lazy("key_data")

    def scalars(self) -> "pl.LazyFrame":
        """Per-step scalars from log_metrics: step, name, value, wall_time, rank."""
        return self._lazy("scalar")

    # -- configs -------------------------------------------------------------------------
    def configs(self, errors: list[str] | None = None) -> dict[int, dict[str, Any]]:
        """save_config() contents per rank: configurations.json (rank 0) and configurations.rank<R>.json.
        Other configurations*.json files are not rlprobe's and are left out (with `errors` given,
        described there, as is an unreadable one instead of raising DumpReadError)."""
        return read_configs(self.path, errors)

    def configs_table(self, errors: list[str] | None = None) -> pa.Table:
        """configs() as rows (rank, path, value): one per leaf, its dotted path, its value as JSON."""
        return configs_as_table(self.configs(errors))

    # -- tensors -------------------------------------------------------------------------
    def tensor(self, key: str, step: int, rank: int = 0, micro_step: int = 0, index: str = "") -> np.ndarray:
        """The saved tensor in its original dtype (float32 for widened bf16/fp16/fp8)."""
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (step, rank, micro_step)):
            raise ValueError(f"step, rank and micro_step take whole numbers, not {step!r}, {rank!r}, {micro_step!r}")
        import pyarrow.compute as pc

        table = self.arrow("key_data")
        mask = pc.and_(pc.and_(pc.equal(table["key"], key), pc.equal(table["step"], step)),
                       pc.and_(pc.and_(pc.equal(table["rank"], rank), pc.equal(table["micro_step"], micro_step)),
                               pc.equal(table["index"], index)))
        rows = table.filter(mask)
        what = f"key {key!r} step {step} rank {rank} micro_step {micro_step} index {index!r}"
        if rows.num_rows == 0:
            if self.hides_rows_of(rank) and not any(lo <= step <= hi for lo, hi in self.committed_ranges(rank)):
                raise DumpReadError(f"{self.path}: no tensor {what}: step {step} of rank {rank} is not committed "
                                    "(a killed run's last steps); rlprobe.open(path, include_uncommitted=True) "
                                    "shows what was written of it")
            raise DumpReadError(f"{self.path}: no tensor {what}")
        row = rows.slice(rows.num_rows - 1).to_pylist()[0]
        if row.get("absent"):
            raise DumpReadError(f"{self.path}: {what} was saved as None (absent): there is no tensor")
        if row["tensor_file"] is None:
            raise DumpReadError(f"{self.path}: {what} was saved as statistics only (no tensor file)")
        return self.load_row_tensor(row)

    def load_tensor(self, tensor_file: str, dtype: str | None, mmap: bool = False, row: dict | None = None) -> np.ndarray:
        path = self.path / tensor_file  # `row`: its key-data row, where a packed file's record is (tensor_pack.py)
        try:
            stored = read_tensor_file(str(path), row, mmap)
        except (OSError, ValueError, EOFError) as e:  # an OSError's strerror: the problem without the path again
            raise DumpReadError(f"{path}: cannot read tensor ({getattr(e, 'strerror', None) or e})") from None
        return restore(stored, dtype)

    def load_row_tensor(self, row: dict[str, Any], mmap: bool = False) -> np.ndarray:  # a key-data row's tensor
        return self.load_tensor(row["tensor_file"], row.get("dtype"), mmap, row)

    # -- SQL -----------------------------------------------------------------------------
    def connect(self, con: "duckdb.DuckDBPyConnection | None" = None, schema: str | None = None,
                errors: list[str] | None = None, *, deep: bool = False) -> "duckdb.DuckDBPyConnection":
        """A DuckDB connection with views key_data, scalars, configs (in `schema` if given). A stats
        part or config file that cannot be read raises DumpReadError naming it or, with `errors`
        given, is described there and left out of the views (`deep`: see checked_parts)."""
        import duckdb

        con = con or duckdb.connect()
        previous = None
        if schema:
            # create_view() takes a bare view name (a "schema".view string becomes one odd name in
            # the current schema), so the views are created while `schema` is the current one
            database, previous = con.sql("SELECT current_database(), current_schema()").fetchall()[0]
            con.execute(f'CREATE SCHEMA IF NOT EXISTS "{_ident(database)}"."{_ident(schema)}"')
            con.execute(f'USE "{_ident(database)}"."{_ident(schema)}"')
        try:
            for view, kind in VIEWS.items():
                self._relation(con, kind, errors, deep).create_view(view, replace=True)
            con.from_arrow(self.configs_table(errors)).create_view("configs", replace=True)
        finally:
            if previous is not None:
                con.execute(f'USE "{_ident(database)}"."{_ident(previous)}"')
        return con

    def _relation(self, con: "duckdb.DuckDBPyConnection", kind: str, errors: list[str] | None = None,
                  deep: bool = False) -> "duckdb.DuckDBPyRelation":
        if self.format == "rlprobe":
            ranks = []
            for rank, files in self.checked_parts(kind, errors, deep=deep).items():
                part = con.read_parquet(files, union_by_name=True, hive_partitioning=False)
                if self.hides_rows_of(rank):
                    part = part.filter(self.committed_expression(kind, rank))
                ranks.append((rank, part))
            return _union_of_ranks(kind, ranks) if ranks else con.from_arrow(_empty(kind))
        return con.from_arrow(self.arrow(kind))

    def committed_expression(self, kind: str, rank: int) -> "duckdb.Expression":
        """A DuckDB filter expression: rank `rank`'s rows of committed steps."""
        from duckdb import ColumnExpression, ConstantExpression

        column = ColumnExpression(step_column(kind))
        visible = ConstantExpression(False)
        for lo, hi in self.committed_ranges(rank):
            visible = visible | column.between(ConstantExpression(lo), ConstantExpression(hi))
        return visible

    def sql(self, query: str, params: Any = None) -> "duckdb.DuckDBPyRelation":
        return self.connect().sql(query, params=params)


def _union_of_ranks(kind: str, ranks: list[tuple[int, "duckdb.DuckDBPyRelation"]]) -> "duckdb.DuckDBPyRelation":
    """Every rank's rows as one relation with its rank column. The union is by position, so each
    rank shows the kind's columns in the kind's order and type (null where a part of an older
    version lacks one, as rlprobe's own SQL names them all), then the columns the kind does not
    define (a newer version's, null in ranks without them)."""
    schema = schema_for(kind)
    columns = {f.name: _DUCKDB_TYPES[str(f.type)] for f in schema}
    for _, part in ranks:
        for name, duck_type in zip(part.columns, part.types):
            if name != "rank":  # the rank is the part's folder's
                columns.setdefault(name, str(duck_type))
    rel = None
    for rank, part in ranks:
        present = dict(zip(part.columns, map(str, part.types)))
        projection = []
        for name, duck_type in columns.items():
            quoted = '"' + _ident(name) + '"'
            if present.get(name) == duck_type:
                projection.append(quoted)
            else:
                source = quoted if name in present else "NULL"
                projection.append(f"CAST({source} AS {duck_type}) AS {quoted}")
        part = part.project(", ".join(projection) + f", {int(rank)}::BIGINT AS rank")
        rel = part if rel is None else rel.union(part)
    assert rel is not None
    return rel


def _empty(kind: str) -> pa.Table:
    return with_rank(schema_for(kind)).empty_table()


def _ident(name: str) -> str:
    return name.replace('"', '""')
