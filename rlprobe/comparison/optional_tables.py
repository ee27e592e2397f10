"""Whether a dump holds the tables a comparison reads beyond key data when they are there: module
statistics (`probe.stage`, modules.py), gradient monitors (grads.py), parameter fingerprints
(params.py). Here, apart from those comparisons, so that a comparison of key data alone never loads
them (~27 kB of source compiled at each start-up where no bytecode is cached: docs/compare.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlprobe.lake.reader import Dump


def has_module_stats(dump: Dump) -> bool:
    """Whether `dump` holds module-level statistics (from `probe.stage`)."""
    return dump.format == "rlprobe" and bool(dump.parts("module"))


def has_grads(dump: Dump) -> bool:
    if dump.format == "rlprobe":
        return bool(dump.parts("grad"))  # without reading them
    return dump.arrow("grad").num_rows > 0  # msprobe grad_probe: read once, kept by the dump


def has_params(dump: Dump) -> bool:
    return dump.format == "rlprobe" and bool(dump.parts("param"))
