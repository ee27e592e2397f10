"""Start-up of the `rlprobe` command, and only of the command: `rlprobe.compare()` and the other functions in a
user's process leave the environment, imports and the interpreter's exit alone (docs/performance.md,
"Comparison: start-up"). Four parts, each measured where it was added:

1. **Native libraries' settings**, made before those libraries load: an environment variable each reads once,
   set only where the user has not set it and the library is not yet loaded.
   - ``MIMALLOC_ALLOW_THP=0``: pyarrow's allocator (mimalloc 3) asks for transparent huge pages, so the first
     touch of each 2 MB region of a thread's fresh heap zeroes all of it in the kernel: `rlprobe compare` of the
     25,600-pair dump spent 0.41-0.52 s of system CPU with 2 workers, 0.26-0.32 s with 4 KB pages.
   - ``OPENBLAS_NUM_THREADS=1``: numpy's OpenBLAS starts a thread per core at import, which spins ~0.1 s of CPU
     during start-up; no command calls BLAS.
2. **Packages kept out**, refused by an import hook as if not installed (``sys.modules[name] = None`` would not
   do: pyarrow's compiled import takes that None for the module): pandas (1.3 s on a busy machine: pyarrow
   imports it on the first array it builds, DuckDB when a Python object is registered; rlprobe passes Arrow
   tables).
3. **How the process ends**: a command whose outputs are all written, closed and published ends it without
   tearing the interpreter down (freeing ~500 modules: ~0.1 s of CPU). Exit handlers still run and
   stdout/stderr are flushed; the fast way is taken only when no other non-daemon thread is alive and no
   profiler, tracer or sys.monitoring tool is set, and only from the console entry point (``run``).
4. **The DuckDB connection opened ahead**: `duckdb.connect()` starts a database (~25-40 ms of CPU, mostly
   DuckDB loading its built-in extensions with the GIL released) on a thread while the command's modules load:

       with ConnectionAhead() as ahead:   # first thing
           ...                            # imports, open the dumps
           con = ahead.take()             # the connection (opened again here if the thread failed)
       # on leaving: the thread waited for, a connection never taken (an error came first) closed
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, MutableMapping, NoReturn

if TYPE_CHECKING:
    import duckdb


# -- native settings --------------------------------------------------------------------------
# variable -> (its value under the command, the module that loads the library reading it)
SETTINGS: Mapping[str, tuple[str, str]] = {
    "MIMALLOC_ALLOW_THP": ("0", "pyarrow"),
    "OPENBLAS_NUM_THREADS": ("1", "numpy"),
}


def command_line_settings(environ: Mapping[str, str], loaded: Mapping[str, object]) -> dict[str, str]:
    """The variables to set: those of SETTINGS that `environ` lacks, whose library is not in `loaded`
    (sys.modules)."""
    return {name: value for name, (value, module) in SETTINGS.items()
            if name not in environ and module not in loaded}


def apply_for_command_line(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set the command line's settings in `environ` (the process's) and return what was set."""
    chosen = command_line_settings(environ, sys.modules)
    environ.update(chosen)
    return chosen


# -- unused imports ---------------------------------------------------------------------------
UNUSED = ("pandas",)


class _Refuse:
    """A meta path finder that refuses `names` (and their submodules) as if they were missing."""

    def __init__(self, names: tuple[str, ...]):
        self.names = names

    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001 - importlib's finder protocol
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"{fullname} is not loaded by the rlprobe command (rlprobe.cli.startup)",
                                      name=fullname)
        return None


@contextmanager
def refused(names: tuple[str, ...] = UNUSED) -> Iterator[None]:
    """Refuse importing `names` inside the block, except those already imported (then nothing
    changes for them). Afterwards they import normally again."""
    missing = tuple(n for n in names if n not in sys.modules)
    if not missing:
        yield
        return
    finder = _Refuse(missing)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


# -- process exit -----------------------------------------------------------------------------

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


# -- connection ahead -------------------------------------------------------------------------
class ConnectionAhead:
    """`duckdb.connect()` run by a thread ("rlprobe-connect") from construction on."""

    def __init__(self) -> None:
        import duckdb  # on the calling thread (the command's first import of it), the connection on the thread

        self._duckdb = duckdb
        self._con: Any = None
        self._taken = False
        self._thread = threading.Thread(target=self._open, name="rlprobe-connect", daemon=True)
        self._thread.start()

    def _open(self) -> None:
        try:
            self._con = self._duckdb.connect()
        except BaseException:  # noqa: BLE001 - take() connects again, on the caller's thread, and raises there
            self._con = None

    def take(self) -> "duckdb.DuckDBPyConnection":
        """The connection (once): the thread's, or one opened now if the thread's failed (its error then
        raised here, as from duckdb.connect())."""
        if self._taken:
            raise RuntimeError("ConnectionAhead.take: the connection was taken already")
        self._taken = True
        self._thread.join()
        con, self._con = self._con, None
        return con if con is not None else self._duckdb.connect()

    def __enter__(self) -> ConnectionAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        """Wait for the thread and close its connection if nobody took it (the comparison failed first)."""
        self._thread.join()
        con, self._con = self._con, None
        if con is not None:
            con.close()


# -- imports beside the pairs -----------------------------------------------------------------
# what `rlprobe compare` and its reports import once the pairs are compared (most of it pyarrow.compute's):
# imported by a thread while the compiled kernels compare the pairs and the command's thread only waits
# (rlprobe.comparison.options.Runtime.beside_pairs); comparison.modules for its follow-up of the verdict, which
# every comparison runs. Not the single-run rules (checks.run), nor the gradient and parameter comparisons: each
# is imported only by a comparison whose dumps need it.
REPORT_MODULES = ("pyarrow.compute", "rlprobe.comparison.config_diff", "rlprobe.comparison.modules",
                  "rlprobe.report.csv_report", "rlprobe.report.xlsx", "rlprobe.report.markdown")


def import_report_modules() -> None:
    """Import REPORT_MODULES; one that fails is left for the import where it is used, which reports it."""
    import importlib

    for name in REPORT_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112
            continue
