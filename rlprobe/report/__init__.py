"""Reports of a comparison: report.xlsx, msprobe-style per-key xlsx, key_data.csv and summary.md.

Writers take the Arrow key_data table and the summary dict that `rlprobe compare` produces;
column headers come in English or msprobe's Chinese (`lang`). Modules load when first used,
so importing this package costs nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["write_report_xlsx", "write_per_key_xlsx", "write_key_data_csv", "write_summary_md", "render_summary_md"]

_WHERE = {
    "write_report_xlsx": "rlprobe.report.xlsx",
    "write_per_key_xlsx": "rlprobe.report.xlsx",
    "write_key_data_csv": "rlprobe.report.csv_report",
    "write_summary_md": "rlprobe.report.markdown",
    "render_summary_md": "rlprobe.report.markdown",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'rlprobe.report' has no attribute {name!r}")
