"""Open a dump for reading: polars LazyFrames, numpy tensors and a DuckDB connection.

rlprobe dumps and msprobe dumps look the same from here: msprobe's JSON statistics become
key_data rows (dtype and counts unknown), its configurations.json the configs table.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rlprobe.errors import DumpReadError
from rlprobe.lake import msprobe_format
from rlprobe.lake.encoding import restore
from rlprobe.lake.layout import RUN_MANIFEST, DumpLayout
from rlprobe.lake.schema import schema_for, step_column, with_rank

if TYPE_CHECKING:
    import duckdb
    import polars as pl

_DUCKDB_TYPES = {"string": "VARCHAR", "int64": "BIGINT", "double": "DOUBLE", "bool": "BOOLEAN",
                 "list<item: int64>": "BIGINT[]", "list<item: double>": "DOUBLE[]"}
CONFIG_SCHEMA = pa.schema([("rank", pa.int64()), ("path", pa.string()), ("value", pa.string())])
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

    def __repr__(self) -> str:
        extra = ", include_uncommitted=True" if self.include_uncommitted else ""
        return f"Dump({str(self.path)!r}, format={self.format!r}{extra})"

    # -- manifests -----------------------------------------------------------------------
    @cached_property
    def manifest(self) -> dict[str, Any]:
        return _json(self.layout.run_manifest) if self.format == "rlprobe" else {"format": self.format}

    @cached_property
    def rank_manifests(self) -> dict[int, dict[str, Any]]:
        if self.format != "rlprobe":
            return {}
        found = {}
        for f in self.path.glob("rank*.json"):
            try:
                found[int(f.stem[4:])] = _json(f)
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
        """Rank `rank`'s committed steps as sorted, disjoint (first, last) ranges; none when its
        manifest is missing."""
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

    @property
    def may_hold_tensors(self) -> bool:
        """Whether element-wise comparison can find tensor files here (key data or module
        tensors); False for statistics-only and gradient-only dumps. A cheap directory check."""
        if self.format == "msprobe":
            return True
        if self.format != "rlprobe":
            return False
        return any((self.path / "tensors" / kind).is_dir() for kind in ("key_data", "module"))

    # -- stats ---------------------------------------------------------------------------
    def parts(self, kind: str) -> dict[int, list[str]]:
        """Live Parquet parts per rank for a stats kind."""
        found: dict[int, list[str]] = {}
        for part in self.layout.live_parts(kind):
            rank = int(part.path.parent.name[5:])
            found.setdefault(rank, []).append(str(part.path))
        return found

    def arrow(self, kind: str, errors: list[str] | None = None) -> pa.Table:
        """A whole stats table with its rank column. With `errors` given, an unreadable part is
        skipped and described there instead of raising DumpReadError."""
        if self.format == "msprobe":
            return self._msprobe_key_data if kind == "key_data" else _empty(kind)
        if self.format == "msprobe-grad":
            return self._msprobe_grad if kind == "grad" else _empty(kind)
        tables = []
        for rank, files in self.parts(kind).items():
            for f in files:
                try:
                    t = pq.read_table(f, partitioning=None)
                except (OSError, pa.ArrowException) as e:
                    message = f"{f}: unreadable Parquet part ({e}); its rows are missing from this dump"
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

    @cached_property
    def _msprobe_key_data(self) -> pa.Table:
        return msprobe_format.key_data_table(self.path)

    @cached_property
    def _msprobe_grad(self) -> pa.Table:  # read once: a summary CSV per rank and step
        return msprobe_format.grad_table(self.path)

    def _lazy(self, kind: str) -> "pl.LazyFrame":
        import polars as pl

        if self.format == "rlprobe":
            frames = []
            for rank, files in self.parts(kind).items():
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
    def configs(self) -> dict[int, dict[str, Any]]:
        """save_config() contents per rank."""
        found = {}
        for f in sorted(self.path.glob("configurations*.json")):
            rank = 0 if f.name == "configurations.json" else int(f.name.split(".rank")[1].split(".")[0])
            found[rank] = _json(f)
        return found

    def configs_table(self) -> pa.Table:
        rows = [{"rank": r, "path": p, "value": json.dumps(v)} for r, cfg in self.configs().items() for p, v in _leaves(cfg)]
        return pa.Table.from_pylist(rows, schema=CONFIG_SCHEMA)

    # -- tensors -------------------------------------------------------------------------
    def tensor(self, key: str, step: int, rank: int = 0, micro_step: int = 0, index: str = "") -> np.ndarray:
        """The saved tensor in its original dtype (float32 for widened bf16/fp16/fp8)."""
        import pyarrow.compute as pc

        table = self.arrow("key_data")
        wanted = ("key", "step", "rank", "micro_step", "index", "tensor_file", "dtype", "absent")
        table = table.select([c for c in wanted if c in table.column_names])
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
        tensor_file, dtype = rows["tensor_file"][-1].as_py(), rows["dtype"][-1].as_py()
        if "absent" in rows.column_names and rows["absent"][-1].as_py():
            raise DumpReadError(f"{self.path}: {what} was saved as None (absent): there is no tensor")
        if tensor_file is None:
            raise DumpReadError(f"{self.path}: {what} was saved as statistics only (no tensor file)")
        return self.load_tensor(tensor_file, dtype)

    def load_tensor(self, tensor_file: str, dtype: str | None, mmap: bool = False) -> np.ndarray:
        path = self.path / tensor_file
        try:
            stored = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise DumpReadError(f"{path}: cannot read tensor ({e})") from None
        return restore(stored, dtype)

    # -- SQL -----------------------------------------------------------------------------
    def connect(self, con: "duckdb.DuckDBPyConnection | None" = None, schema: str | None = None) -> "duckdb.DuckDBPyConnection":
        """A DuckDB connection with views key_data, scalars, configs (in `schema` if given)."""
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
                self._relation(con, kind).create_view(view, replace=True)
            con.from_arrow(self.configs_table()).create_view("configs", replace=True)
        finally:
            if previous is not None:
                con.execute(f'USE "{_ident(database)}"."{_ident(previous)}"')
        return con

    def _relation(self, con: "duckdb.DuckDBPyConnection", kind: str) -> "duckdb.DuckDBPyRelation":
        if self.format == "rlprobe":
            rel = None
            for rank, files in self.parts(kind).items():
                part = con.read_parquet(files, union_by_name=True)
                if self.hides_rows_of(rank):
                    part = part.filter(self.committed_expression(kind, rank))
                # the schema's columns in its order, null where older parts lack one (`absent`):
                # the union below is by position, and views and rlprobe's own SQL name them all
                present = set(part.columns)
                columns = [f'"{f.name}"' if f.name in present
                           else f'CAST(NULL AS {_DUCKDB_TYPES[str(f.type)]}) AS "{f.name}"' for f in schema_for(kind)]
                part = part.project(", ".join(columns) + f", {int(rank)}::BIGINT AS rank")
                rel = part if rel is None else rel.union(part)
            if rel is not None:
                return rel
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


def _empty(kind: str) -> pa.Table:
    try:
        return with_rank(schema_for(kind)).empty_table()
    except ValueError:
        return pa.table({"rank": pa.array([], pa.int64())})


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise DumpReadError(f"{path}: unreadable JSON ({e})") from None


def _leaves(obj: Any, prefix: str = ""):
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, obj


def _ident(name: str) -> str:
    return name.replace('"', '""')
