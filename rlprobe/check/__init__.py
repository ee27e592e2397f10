"""`rlprobe check`: what is wrong inside ONE run, no baseline needed (docs/check.md).

    result = rlprobe.check("./dump")            # CheckResult: exit_code, results, rows, tables
    rlprobe.check("./dump", out="./check")      # also check.parquet, summary.json/md, report.xlsx, plots/
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any


def check_dump(dump: Any, params: dict[str, Any] | None = None, only: tuple[str, ...] | None = None) -> Any:
    """The checks as tables, no reports (see rlprobe.check.run.check_dump)."""
    from rlprobe.check.run import check_dump as run_checks

    return run_checks(dump, params, only)


def check(dump: Any, out: str | Path | None = None, params: dict[str, Any] | None = None, *, plots: bool = True,
          **more_params: Any) -> Any:
    """Run every check on one dump; with `out`, publish the reports there. Parameters (thresholds,
    eps, group_size...) as in docs/check.md, given as `params` or keywords."""
    from rlprobe.check.run import check_dump

    result = check_dump(dump, {**(params or {}), **more_params})
    if out is not None:
        from rlprobe.report.check_report import publish_check

        publish_check(result, Path(out), plots=plots)
    return result


class _CallableModule(types.ModuleType):
    """`rlprobe.check(dump, ...)` works also after `import rlprobe.check` binds the package there."""

    def __call__(self, dump: Any, out: str | Path | None = None, params: dict[str, Any] | None = None, *,
                 plots: bool = True, **more_params: Any) -> Any:
        return check(dump, out, params, plots=plots, **more_params)


sys.modules[__name__].__class__ = _CallableModule
