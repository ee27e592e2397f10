"""Where numba keeps its compiled kernels: shared by the comparison kernels and the CPU gradient
kernel, so neither has to import the other to set it."""

from __future__ import annotations

import os
import sys


def use_user_cache_dir() -> None:
    """Point numba's on-disk cache at a user cache dir unless the user chose one.

    ``cache=True`` would otherwise try to write next to the installed package, which fails
    for read-only installs. Only done when numba has not been imported yet (it reads the
    variable at import) and the directory can be created.
    """
    if os.environ.get("NUMBA_CACHE_DIR") or "numba" in sys.modules:
        return
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "rlprobe", "numba")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return
    if os.access(path, os.W_OK | os.X_OK):
        os.environ["NUMBA_CACHE_DIR"] = path
