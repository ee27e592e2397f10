"""Settings of the native libraries under the `rlprobe` command, made before they load (issue 18;
docs/performance.md, "Two workers against one, and what bounds it"). Each is an environment variable the library reads once,
when it is loaded: set only when the user has not set it and only when that library is not yet in
the process (then it would not read it). Only for the command line: `rlprobe.compare()` in a
user's process leaves the environment alone.

- ``MIMALLOC_ALLOW_THP=0``: pyarrow's allocator (mimalloc 3) asks for transparent huge pages, so
  the first touch of each 2 MB region of a fresh heap zeroes all of it in the kernel. Every
  thread that builds Arrow arrays (the report writers, the pair workers) starts a heap of its own:
  `rlprobe compare` of the 25,600-pair dump spent 0.41-0.52 s of system CPU with 2 workers and
  0.26-0.36 s with one, the difference nearly all zeroing such pages (perf: clear_page_erms under
  mimalloc's page faults); with 4 KB pages 0.26-0.32 s and 0.22-0.26 s, user time equal.
- ``OPENBLAS_NUM_THREADS=1``: numpy's OpenBLAS starts a thread per core when numpy is imported,
  which spins ~0.1 s of CPU on the other core during start-up; no command calls BLAS for work
  that a second thread would speed up (the comparison kernels never call BLAS).
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, MutableMapping

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
