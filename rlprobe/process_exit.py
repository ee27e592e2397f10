"""How the `rlprobe` process ends: a command whose outputs are all written, closed and published
may end it without tearing the interpreter down (freeing ~500 modules, pyarrow's and DuckDB's
among them: ~0.1 s of CPU, a tenth of a small comparison's start-up, issue 18).

Exit handlers (``atexit``) still run and stdout/stderr are flushed; the fast way is taken only when
no other non-daemon thread is alive and no profiler, tracer or sys.monitoring tool is set (``python -m
cProfile`` writes its file after the program returns), and only from the console entry point (``run``),
never when rlprobe is called inside another program or a test.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Callable, NoReturn

__all__ = ["outputs_closed", "run"]

_closed = False


def outputs_closed() -> None:
    """Called by a command once everything it wrote is closed and in place (its exit code may follow)."""
    global _closed
    _closed = True


def run(main: Callable[[], object]) -> NoReturn:
    """Run a click command in standalone mode (it ends by raising SystemExit); end the process at
    once when the command said its outputs are closed, else the usual way."""
    try:
        main()
    except SystemExit as done:
        others = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
        if not _closed or others or _watched() or not (done.code is None or isinstance(done.code, int)):
            raise
        code = done.code or 0
    else:
        raise SystemExit(0)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: what the interpreter would ignore too
            pass
    os._exit(code)


def _watched() -> bool:
    """Whether a profiler, tracer, debugger or coverage tool watches the process (cProfile writes its file
    after the program returns): set with sys.setprofile / sys.settrace, or, from Python 3.12 (whose cProfile
    uses it), registered with sys.monitoring."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return True
    monitoring = getattr(sys, "monitoring", None)  # its tools have the ids 0 to 5
    return monitoring is not None and any(monitoring.get_tool(tool) is not None for tool in range(6))
