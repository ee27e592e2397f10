"""Many dumps and comparison results in one DuckDB connection, for `rlprobe sql --run name=path`.

`rlprobe sql OUT` and `rlprobe info OUT` read a result directory alone (`connect_result_dir`,
`result_views`). Each run becomes a schema: a dump gives `name.key_data`, `name.scalars`, `name.configs`; a
comparison or pipeline output directory gives one view per Parquet file (`name.key_data`,
`name.scalars`, `name.queries_<query>`, `name.gates_<gate>`). Every table name found in any
run is also in the main schema as `all_<table>`, the runs stacked with a `run` column.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rlprobe.errors import DumpReadError, ProbeError

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_run_option(value: str) -> tuple[str, str]:
    """'baseline=./dumps/a' -> ('baseline', './dumps/a')."""
    name, sep, path = value.partition("=")
    name = name.strip()
    if not sep or not path.strip():
        raise ProbeError(f"--run {value!r}: expected NAME=PATH, e.g. --run a=./dumps/a")
    if not IDENTIFIER.match(name):
        raise ProbeError(f"--run {value!r}: the name {name!r} must be a SQL identifier (letters, digits, _)")
    return name, path.strip()


def is_result_dir(path: Path) -> bool:
    """A directory written by `rlprobe compare` or `rlprobe pipeline run`."""
    return path.is_dir() and (path / "key_data.parquet").is_file() and (path / "summary.json").is_file()


def attach_runs(runs: list[tuple[str, str]], con: Any = None, include_uncommitted: bool = False) -> Any:
    """A DuckDB connection with one schema per run and the stacked all_<table> views (dumps read with
    `include_uncommitted` as rlprobe.open reads them)."""
    import duckdb

    con = con or duckdb.connect()
    seen: dict[str, list[str]] = {}
    names = [n for n, _ in runs]
    if len(set(names)) != len(names):
        raise ProbeError(f"--run names must differ; got {names}")
    for name, path in runs:
        root = Path(path)
        if is_result_dir(root):
            views = _attach_result_dir(con, name, root)
        else:
            from rlprobe.lake.reader import open_dump

            open_dump(root, include_uncommitted).connect(con, schema=name)  # DumpReadError names the path
            views = ["key_data", "scalars", "configs"]
        for view in views:
            seen.setdefault(view, []).append(name)
    for view, owners in seen.items():
        parts = [f"SELECT '{owner}' AS run, * FROM \"{owner}\".\"{view}\"" for owner in owners]
        con.execute(f'CREATE OR REPLACE VIEW "all_{view}" AS ' + " UNION ALL BY NAME ".join(parts))
    return con


def check_every_file(paths: list[str]) -> None:
    """Read whole every Parquet file behind the views of the runs at `paths` (dumps and result
    directories); DumpReadError names the first that cannot be read. For a query that failed on
    a corrupt data page, which DuckDB reports without the file (slow: every page is read)."""
    import pyarrow.parquet as pq

    from rlprobe.lake.parts import unreadable_part
    from rlprobe.lake.reader import open_dump

    for path in paths:
        root = Path(path)
        if not is_result_dir(root):
            open_dump(root).check_every_page()
            continue
        for f in _result_files(root):
            try:
                pq.read_table(f)
            except Exception as e:  # pyarrow's OSError or ArrowException: a corrupt file
                raise DumpReadError(unreadable_part(f, e)) from None


def _result_files(root: Path) -> list[Path]:
    return sorted(root.glob("*.parquet")) + sorted(root.glob("queries/*.parquet")) + sorted(root.glob("gates/*.parquet"))


def result_views(root: Path) -> list[tuple[str, Path]]:
    """The views of a result directory, (name, Parquet file): key_data, queries_<q>, gates_<g>, ..."""
    named = [(f.stem if f.parent == root else f"{f.parent.name}_{f.stem}", f) for f in _result_files(root)]
    return [(view, f) for view, f in named if IDENTIFIER.match(view)]


def connect_result_dir(root: Path, con: Any = None) -> Any:
    """A DuckDB connection whose main schema has the result directory's views, as `rlprobe sql OUT` reads it."""
    import duckdb

    con = con or duckdb.connect()
    _create_views(con, root)
    return con


def _attach_result_dir(con: Any, name: str, root: Path) -> list[str]:
    database, previous = con.sql("SELECT current_database(), current_schema()").fetchall()[0]
    con.execute(f'CREATE SCHEMA IF NOT EXISTS "{database}"."{name}"')
    con.execute(f'USE "{database}"."{name}"')
    try:
        return _create_views(con, root)
    finally:
        con.execute(f'USE "{database}"."{previous}"')


def _create_views(con: Any, root: Path) -> list[str]:
    views = []
    for view, f in result_views(root):
        try:
            con.read_parquet(str(f)).create_view(view, replace=True)
        except Exception as e:  # duckdb.Error: an unreadable file
            raise DumpReadError(f"{f}: unreadable Parquet file ({e})") from None
        views.append(view)
    return views
