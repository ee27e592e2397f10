"""rlprobe: capture RL training key data into a Parquet lake and find where two runs diverge.

Heavy modules (pyarrow, duckdb, polars, torch) load only when first used, so the command
line starts fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


def compare(a: Any, b: Any, out: Any, **options: Any) -> dict[str, Any]:
    """Compare run `b` against run `a`, write the output folder `out` and return its summary
    (the options: rlprobe.comparison.options.CompareOptions; docs/comparing.md)."""
    from rlprobe.pipeline.compare_command import compare as run_compare

    return run_compare(a, b, out, **options)


def check(dump: Any, out: Any = None, params: dict[str, Any] | None = None, *, plots: bool = True,
          **more_params: Any) -> Any:
    """Check one run on its own, no baseline (docs/check.md): rlprobe.check(dump, out=None, params=None,
    **params) -> CheckResult."""
    from rlprobe.pipeline.check_command import check as run_check

    return run_check(dump, out, params, plots=plots, **more_params)


def __getattr__(name: str) -> Any:
    if name == "Probe":
        from rlprobe.capture.probe import Probe

        return Probe
    if name == "Dump":
        from rlprobe.lake.reader import Dump

        return Dump
    raise AttributeError(f"module 'rlprobe' has no attribute {name!r}")
