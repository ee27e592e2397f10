"""Packages the `rlprobe` command never uses but that libraries it loads would import when
installed: kept out of the process while a command runs, so they cost no start-up.

- pandas (1.3 s to import on a busy machine): pyarrow imports it on the first array it builds
  (its pandas shim checks whether an object is a DataFrame), DuckDB when a Python object is
  registered. rlprobe passes Arrow tables, never DataFrames.
- scipy (0.15 s): numba loads scipy's BLAS bindings; the comparison kernels never call BLAS.
- cffi (0.1 s, with pycparser): numba's cffi support; no kernel calls a C function.

The packages are refused by an import hook, as if not installed (`sys.modules[name] = None`
would not do: pyarrow's compiled import takes that None for the module). Only for the
command line: `rlprobe.compare()` in a user's process leaves imports alone.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

UNUSED = ("pandas", "scipy", "cffi")


class _Refuse:
    """A meta path finder that refuses `names` (and their submodules) as if they were missing."""

    def __init__(self, names: tuple[str, ...]):
        self.names = names

    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001 - importlib's finder protocol
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"{fullname} is not loaded by the rlprobe command (rlprobe.unused_imports)",
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
