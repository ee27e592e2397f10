"""A DuckDB connection opened by a thread while the caller goes on importing (start-up, issue 18).

`duckdb.connect()` starts a database (~25-40 ms of CPU here, most of it DuckDB loading its built-in
extensions, with the GIL released), which a comparison otherwise does after its ~0.4 s of imports,
on the one thread. This module imports only DuckDB, so the connection starts before pyarrow, numpy and
rlprobe's own modules load:

    with ConnectionAhead() as ahead:   # first thing
        ...                            # imports, open the dumps
        con = ahead.take()             # the connection (opened again here if the thread failed)
    # on leaving: the thread waited for, a connection never taken (an error came first) closed
"""

from __future__ import annotations

import threading
from typing import Any

import duckdb


class ConnectionAhead:
    """`duckdb.connect()` run by a thread ("rlprobe-connect") from construction on."""

    def __init__(self) -> None:
        self._con: Any = None
        self._taken = False
        self._thread = threading.Thread(target=self._open, name="rlprobe-connect", daemon=True)
        self._thread.start()

    def _open(self) -> None:
        try:
            self._con = duckdb.connect()
        except BaseException:  # noqa: BLE001 - take() connects again, on the caller's thread, and raises there
            self._con = None

    def take(self) -> duckdb.DuckDBPyConnection:
        """The connection (once): the thread's, or one opened now if the thread's failed (its error then
        raised here, as from duckdb.connect())."""
        if self._taken:
            raise RuntimeError("ConnectionAhead.take: the connection was taken already")
        self._taken = True
        self._thread.join()
        con, self._con = self._con, None
        return con if con is not None else duckdb.connect()

    def __enter__(self) -> ConnectionAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        """Wait for the thread and close its connection if nobody took it (the comparison failed first)."""
        self._thread.join()
        con, self._con = self._con, None
        if con is not None:
            con.close()
