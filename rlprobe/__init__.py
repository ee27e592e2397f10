"""rlprobe: capture RL training key data into a Parquet lake and find where two runs diverge.

Heavy modules (pyarrow, duckdb, polars, torch) load only when first used, so the command
line starts fast.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

from rlprobe import check, compare  # light (no heavy imports); made callable below
from rlprobe._version import __version__
from rlprobe.errors import DumpReadError, ProbeError

if TYPE_CHECKING:
    from rlprobe.capture.probe import Probe
    from rlprobe.lake.reader import Dump

__all__ = ["Probe", "ProbeError", "DumpReadError", "Dump", "open", "compare", "check", "from_config", "__version__"]


def open(path: Any, include_uncommitted: bool = False) -> "Dump":  # noqa: A001 - mirrors io.open: rlprobe.open(dump)
    """Open a dump (rlprobe or msprobe format) for reading. Statistics of steps that were never
    committed (a killed run's last steps) are left out unless `include_uncommitted=True`."""
    from rlprobe.lake.reader import open_dump

    return open_dump(path, include_uncommitted)


def from_config(cfg: Any, **probe_kwargs: Any) -> Any:
    """A probe switched by a training config's rlprobe_config (or msprobe_config) section; see docs/modules.md."""
    from rlprobe.capture.config import from_config as build

    return build(cfg, **probe_kwargs)


class _CallableCompare(types.ModuleType):
    """rlprobe.compare as a function: rlprobe.compare(a, b, out, **options) -> summary."""

    def __call__(self, a: Any, b: Any, out: Any, **options: Any) -> dict[str, Any]:
        from rlprobe.pipeline.compare_command import compare

        return compare(a, b, out, **options)


class _CallableCheck(types.ModuleType):
    """rlprobe.check as a function: rlprobe.check(dump, out=None, params=None, **params) -> CheckResult."""

    def __call__(self, dump: Any, out: Any = None, params: dict[str, Any] | None = None, *, plots: bool = True,
                 **more_params: Any) -> Any:
        from rlprobe.pipeline.check_command import check as run_check

        return run_check(dump, out, params, plots=plots, **more_params)


compare.__class__ = _CallableCompare
check.__class__ = _CallableCheck


def __getattr__(name: str) -> Any:
    if name == "Probe":
        from rlprobe.capture.probe import Probe

        return Probe
    if name == "Dump":
        from rlprobe.lake.reader import Dump

        return Dump
    raise AttributeError(f"module 'rlprobe' has no attribute {name!r}")
