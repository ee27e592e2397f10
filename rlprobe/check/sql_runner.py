"""Run one sql/check/ query: its parameters bound as DuckDB variables, never pasted into SQL.

Each query's header declares its parameters and their defaults, one a line:
`-- param NAME = VALUE : what it means` (VALUE in JSON). `run(con, "name.sql", **params)` is the
one way the check package runs SQL, so swapping it for a shared runner is one import.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import pyarrow as pa

from rlprobe.resources import sql_text

_PARAM = re.compile(r"^--\s*param\s+([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.+?)\s*:\s", re.M)


@lru_cache(maxsize=None)
def query_text(name: str) -> str:
    return sql_text(f"check/{name}")


@lru_cache(maxsize=None)
def defaults(name: str) -> dict[str, Any]:
    """The parameters a query declares in its header, with their default values."""
    return {m.group(1): json.loads(m.group(2)) for m in _PARAM.finditer(query_text(name))}


def run(con: Any, name: str, **params: Any) -> pa.Table:
    """The rows of sql/check/<name>; parameters not given take the header's defaults. A parameter
    the query does not declare is refused, naming the query and what it declares."""
    declared = defaults(name)
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise ValueError(f"sql/check/{name}: unknown parameter(s) {unknown}; it declares {sorted(declared)}")
    for key, value in {**declared, **params}.items():
        con.execute(f'SET VARIABLE "{key}" = ?', [value])
    statement = query_text(name).strip().rstrip(";")
    return con.sql(statement).to_arrow_table()
