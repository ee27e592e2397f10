"""Comparing two runs: pair kernels, executors, SQL matching, verdicts.

The package itself is callable, so `rlprobe.compare(a, b, out)` runs a whole comparison and
returns its summary (see rlprobe.compare.run.compare for the options).
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, a: Any, b: Any, out: Any, **options: Any) -> dict[str, Any]:
        from rlprobe.compare.run import compare

        return compare(a, b, out, **options)


sys.modules[__name__].__class__ = _CallableModule
