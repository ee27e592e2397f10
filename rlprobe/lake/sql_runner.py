"""The one way rlprobe runs SQL: `run(con, "name.sql", **params)` loads a bundled file of sql/,
binds the parameters (never pastes them into the text) and returns an Arrow table.

Every layer (lake, compare, check, pipeline, the CLI) runs its queries through here, so the DuckDB
to Arrow conversion, statement clean-up and row records exist once. The bundled sql/, pipelines/ and
examples/ folders are found here too (resource_dir: installed or in a checkout).

Parameters with a default (the gates of sql/gates/, the checks of sql/check/) are declared in the
query's header, one a line, and read in the SQL with getvariable('NAME'):

    -- param NAME = VALUE : what it means          (VALUE in JSON: 0.05, "loss", true)

Other queries take their parameters as $NAME, bound by DuckDB."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import tempfile
import weakref
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow as pa

# what a comparison's database keeps in memory; tables, joins and sorts beyond it spill to a folder of its own
# (bound_memory): without it DuckDB takes up to 80 % of the machine, and held a 409,600-pair comparison's
# statistics, pairs and key_data result whole (~0.8 GB of the command's 1.4 GB peak)
MEMORY_LIMIT = "512MB"
_spill_folders = itertools.count()
# a header line declaring a parameter and its default: -- param tps_max_drop = 0.05 : what it means
_PARAM = re.compile(r"^--\s*param\s+([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.+?)\s*:\s", re.MULTILINE)


def statement(sql: str) -> str:
    """`sql` without surrounding blanks and a trailing semicolon (to nest it in another statement)."""
    return sql.strip().rstrip(";").strip()


def bound_memory(con: Any, limit: str = MEMORY_LIMIT) -> None:
    """Keep `con`'s database within `limit` of memory: what is more spills to a folder under the system's
    temporary folder, made by DuckDB when it first spills and removed when the database closes (or the
    process exits). A database already bounded is left as it is (its folder cannot change once used)."""
    if _bounded(con):
        return
    folder = os.path.join(tempfile.gettempdir(), f"rlprobe-duckdb-{os.getpid()}-{next(_spill_folders)}")
    con.execute("SET memory_limit = ?", [limit])
    con.execute("SET temp_directory = ?", [folder])
    weakref.finalize(con, shutil.rmtree, folder, ignore_errors=True)


def to_arrow(relation: Any) -> pa.Table:
    """A DuckDB relation as an Arrow table (DuckDB 1.x and 2.x spell it differently); an empty
    table for a statement that returns no relation."""
    if relation is None:
        return pa.table({})
    to_table = getattr(relation, "to_arrow_table", None) or getattr(relation, "arrow")
    table = to_table()
    return table.read_all() if hasattr(table, "read_all") else table


def query(con: Any, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
    """The result of the SQL text `sql` (one statement) as an Arrow table. Where a bounded database
    (bound_memory) runs out of memory, its bound is doubled and the statement run again (RAISES_OF_BOUND times
    at most): a query's pinned memory still grows with its rows (key_data.sql's join and sort held ~0.7 KB a
    pair on two threads), and a bound is to cap memory, not to fail a comparison that ran before."""
    for raised in range(RAISES_OF_BOUND + 1):
        try:
            return to_arrow(con.sql(statement(sql), params=params or None))
        except Exception as error:  # noqa: BLE001 - duckdb.OutOfMemoryException, and only where bounded
            if type(error).__name__ != "OutOfMemoryException" or raised == RAISES_OF_BOUND or not _bounded(con):
                raise
            limit = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
            con.execute("SET memory_limit = ?", [f"{2 * _bytes(limit) >> 20}MiB"])
    raise AssertionError("unreachable")


RAISES_OF_BOUND = 3


def _bounded(con: Any) -> bool:
    """Whether bound_memory bounded `con`'s database."""
    folder = con.execute("SELECT current_setting('temp_directory')").fetchall()[0][0]
    return os.path.basename(folder).startswith(f"rlprobe-duckdb-{os.getpid()}-")


def _bytes(size: str) -> int:
    """DuckDB's memory_limit as it shows it ("488.2 MiB", "1.2 GiB") in bytes."""
    number, unit = size.split()
    return int(float(number) * 1024 ** ("KiB", "MiB", "GiB", "TiB").index(unit) * 1024)


def run(con: Any, name: str, **params: Any) -> pa.Table:
    """The result of the bundled sql/`name` as an Arrow table. A query that declares its parameters
    (`-- param` lines) gets them as variables, the defaults for those not given; a parameter it does
    not declare is refused (ValueError naming the query). Other queries get `params` as $names."""
    declared = query_params(name)
    if not declared:
        return query(con, sql_text(name), params)
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise ValueError(f"sql/{name}: unknown parameter(s) {unknown}; it declares {sorted(declared)}")
    set_variables(con, {**declared, **params})
    return query(con, sql_text(name))


@lru_cache(maxsize=None)
def query_params(name: str) -> dict[str, Any]:
    """The parameters the bundled sql/`name` declares in its header, with their defaults."""
    return declared_params(sql_text(name))


def records(con: Any, name: str, **params: Any) -> list[dict[str, Any]]:
    """The rows of the bundled sql/`name` as dicts (for the few rows a verdict reads)."""
    cursor = con.execute(statement(sql_text(name)), params or None)
    columns = [d[0] for d in cursor.description]
    return [dict(zip(columns, row)) for row in cursor.fetchall()]


def execute(con: Any, name: str, **params: Any) -> None:
    """Run the bundled sql/`name` for its effect (CREATE MACRO / VIEW statements; several allowed)."""
    con.execute(sql_text(name), params or None)


def create_table(con: Any, table: str, name: str, **params: Any) -> None:
    """The result of the bundled sql/`name` as the temporary DuckDB table `table`."""
    con.execute(f'CREATE OR REPLACE TEMP TABLE "{table}" AS {statement(sql_text(name))}', params or None)


def declared_params(sql: str) -> dict[str, Any]:
    """The parameters a query declares in its header (`-- param NAME = VALUE : meaning`), with their
    defaults. Raises ValueError for a VALUE that is not JSON."""
    found: dict[str, Any] = {}
    for m in _PARAM.finditer(sql):
        try:
            found[m.group(1)] = json.loads(m.group(2))
        except ValueError:
            raise ValueError(f"'-- param {m.group(1)} = {m.group(2)}': the default must be JSON "
                             '(a number, true/false, or a "quoted string")') from None
    return found


def create_table_as(con: Any, table: str, sql: str) -> None:
    """The result of the SQL text `sql` (a user's query) as the temporary DuckDB table `table`."""
    con.execute(f'CREATE TEMP TABLE "{table}" AS {statement(sql)}')


def store(con: Any, table: str, data: pa.Table) -> None:
    """The Arrow table `data` copied into DuckDB as the temporary table `table`."""
    helper = f"_{table}_arrow"
    con.register(helper, data)
    try:
        con.execute(f'CREATE OR REPLACE TEMP TABLE "{table}" AS SELECT * FROM "{helper}"')
    finally:
        con.unregister(helper)


def set_variables(con: Any, values: dict[str, Any]) -> None:
    """Each value as a DuckDB variable that SQL reads with getvariable('name') (bound, never pasted)."""
    for name, value in values.items():
        con.execute(f'SET VARIABLE "{name}" = ?', [value])


BUNDLED = ("sql", "pipelines", "examples")


def resource_dir(name: str) -> Path:
    """Path of a bundled top-level folder: inside the wheel, else the source checkout."""
    if name not in BUNDLED:
        raise ValueError(f"unknown resource folder {name!r}; expected one of {BUNDLED}")
    installed = resources.files("rlprobe") / "_bundled" / name
    if installed.is_dir():
        return Path(str(installed))
    checkout = Path(__file__).resolve().parents[2] / name  # rlprobe/lake/ -> the checkout
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"rlprobe's {name}/ folder is missing from this installation ({installed})")


def sql_text(name: str) -> str:
    """The text of a bundled SQL file, e.g. sql_text('info_key_data.sql')."""
    return (resource_dir("sql") / name).read_text(encoding="utf-8")
