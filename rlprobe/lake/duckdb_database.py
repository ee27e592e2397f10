"""One in-memory DuckDB database per process, and a connection of its own for each caller.

`duckdb.connect()` starts a database each time (its catalog and its worker threads: ~25 ms of CPU and
25-50 ms of wall time on the 2-core VM), a cursor on a running one ~20 µs; `rlprobe compare` of two
runs opened three (the comparison, and `rlprobe check`'s rules on each run). A connection keeps its
registered Arrow tables, variables, temporary tables and macros to itself, and every table and macro
rlprobe makes is TEMP, so two connections never see each other's, whichever threads use them. A
process forked after the database started gets a database of its own (the parent's threads are gone)."""

from __future__ import annotations

import os
import threading
from typing import Any

_lock = threading.Lock()
_database: tuple[int, Any] | None = None  # (pid, the connection that started it)


def connection() -> Any:
    """A new DuckDB connection on the process's in-memory database (started by the first call)."""
    import duckdb

    global _database
    with _lock:
        if _database is None or _database[0] != os.getpid():
            _database = (os.getpid(), duckdb.connect())
        return _database[1].cursor()
