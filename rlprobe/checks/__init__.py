"""`rlprobe check`: what is wrong inside ONE run, no baseline needed (docs/check.md). It reads the
lake and returns tables; its reports are rlprobe.report's (check_report.py), published by
rlprobe.pipeline.check_command. The two-run verdict (rlprobe.comparison) reads its rules too, so checks
never imports comparison.

    result = rlprobe.check("./dump")            # CheckResult: exit_code, results, rows, tables
    rlprobe.check("./dump", out="./check")      # also check.parquet, summary.json/md, report.xlsx, plots/
"""

from __future__ import annotations

from typing import Any, Mapping


def check_dump(dump: Any, params: dict[str, Any] | None = None, only: tuple[str, ...] | None = None,
               key_map: Mapping[str, str] | None = None) -> Any:
    """The checks as tables, no reports (see rlprobe.checks.run.check_dump); `key_map`: saved key ->
    canonical key, over rlprobe/key_names.csv."""
    from rlprobe.checks.run import check_dump as run_checks

    return run_checks(dump, params, only, key_map=key_map)
