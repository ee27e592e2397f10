"""A comparison's options as two objects, which `rlprobe compare`, `rlprobe.compare()` and pipelines
build and compare_dumps takes: CompareOptions, what is compared (the selection, workers, the tolerance:
rlprobe/comparison/tolerance.py, the key map, the config diff's ignore list, the gradient and module
comparisons' settings, and a control run: comparison/control_run.py), and Runtime, how the caller takes
part in it (progress, the executor of the pairs, the DuckDB connection, what runs beside the pairs).

The module's last functions say whether a dump holds the tables a comparison reads beyond key data when they are
there: module statistics (`probe.stage`, modules.py), gradient monitors (grads.py), parameter fingerprints
(params.py); here, apart from those comparisons, so that a comparison of key data alone never loads them.

Only the standard library (and tolerance.py) at import: the command builds its options first."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping

from rlprobe.comparison.tolerance import Tolerance
from rlprobe.errors import ProbeError, SelectionError

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from rlprobe.lake.reader import Dump


@dataclass(frozen=True)
class CompareOptions:
    """What to compare and how. `keys`, `steps`, `ranks`: None (all) or lists; `tolerance`: when a
    pair that is not bitwise equal agrees (`close`); `grads`: compare_grads' thresholds
    (first_step_min, max_drop, norm_rtol, layout_similarity_min); `modules`: compare_modules' keyword
    arguments (e.g. stages=[...]); `order`: the data-flow order of keys (default key_aliases.DEFAULT_ORDER); `control`: the
    path of a control run, which differs from run A only by noise: its error against A, per key and step, widens
    the tolerance (comparison/control_run.py; None: the dtype tolerances alone)."""

    keys: list[str] | None = None
    steps: list[int] | None = None
    ranks: list[int] | None = None
    workers: int = 2
    tolerance: Tolerance = field(default_factory=Tolerance)
    order: list[str] | None = None
    key_map: Mapping[str, str] | None = None
    config_ignore: list[str] | None = None
    config_ignore_defaults: bool = True
    grads: Mapping[str, float] | None = None
    modules: Mapping[str, Any] | None = None
    control: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        if self.control is not None and not isinstance(self.control, (str, os.PathLike)):
            raise ProbeError(f"control must be the path of a control run's dump (str or os.PathLike), "
                             f"not {self.control!r}")
        if type(self.workers) is not int or self.workers < 1:
            raise ProbeError(f"workers must be a whole number >= 1, not {self.workers!r}")
        if not isinstance(self.tolerance, Tolerance):
            raise ProbeError(f"tolerance must be a rlprobe.comparison.tolerance.Tolerance (CompareOptions.build takes "
                             f"a mapping), not {self.tolerance!r}")

    @classmethod
    def build(cls, *, keys: Any = None, steps: Any = None, ranks: Any = None, tolerance: Any = None,
              rtol: float | None = None, atol: float | None = None, stats_rtol: float | None = None,
              **options: Any) -> "CompareOptions":
        """Options from what a user writes: keys, steps and ranks as the command takes them ("log_prob,kl",
        "0-10,12") or as lists (SelectionError for one that is malformed); `tolerance` a Tolerance, a number
        (rtol) or a mapping {rtol, atol, stats_rtol, families, keys} (ProbeError naming the field);
        `rtol`, `atol`, `stats_rtol` (the command line's) over it; the other fields as they are."""
        from rlprobe.selection import parse_int_set, parse_key_list

        try:
            keys, steps, ranks = parse_key_list(keys), parse_int_set(steps, "steps"), parse_int_set(ranks, "ranks")
        except ValueError as e:
            raise SelectionError(str(e)) from None
        try:
            chosen = Tolerance.of(tolerance).with_overrides(rtol=rtol, atol=atol, stats_rtol=stats_rtol)
        except ValueError as e:
            raise ProbeError(str(e)) from None
        return cls(keys=keys, steps=steps, ranks=ranks, tolerance=chosen, **options)

    def with_(self, **changes: Any) -> "CompareOptions":
        """A copy with `changes` (dataclasses.replace)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Runtime:
    """How the caller takes part in a comparison, beside what it compares (all optional).

    `progress(done, total)`: bytes of the pairs compared so far. `executor`: runs the pair kernels, called like
    rlprobe.comparison.executor.run_pairs(tasks, workers=, progress=) (default: that one). `con`: the DuckDB
    connection to compare in; both runs' statistics are left in it as the tables stats_a and stats_b (and
    key_data, key_rollup, step_rollup are registered there) instead of being returned as Arrow tables.
    `connect()`: opens the connection when `con` is None (default duckdb.connect; the command's is opened by a
    thread during its imports: rlprobe.cli.startup.ConnectionAhead). `key_data_ready(key_data)`: called once
    key_data is final, before the verdict's queries (the command renders its files on a thread from then on:
    rlprobe.report.comparison_files.KeyDataFiles). `beside_pairs()`: run on a thread while the compiled kernels
    compare the pairs and the calling thread only waits (the command imports its report modules there:
    rlprobe.cli.startup.import_report_modules). `stats=False`: stats_a and stats_b are not returned (the command
    writes neither)."""

    progress: Callable[[int, int], None] | None = None
    executor: Callable[..., Any] | None = None
    con: "duckdb.DuckDBPyConnection | None" = None
    connect: "Callable[[], duckdb.DuckDBPyConnection] | None" = None
    key_data_ready: "Callable[[pa.Table], None] | None" = None
    beside_pairs: Callable[[], None] | None = None
    stats: bool = True



# -- whether a dump holds the tables a comparison reads beyond key data, when they are there --------------

def has_module_stats(dump: Dump) -> bool:
    """Whether `dump` holds module-level statistics (from `probe.stage`)."""
    return dump.format == "rlprobe" and bool(dump.parts("module"))


def has_grads(dump: Dump) -> bool:
    if dump.format == "rlprobe":
        return bool(dump.parts("grad"))  # without reading them
    return dump.arrow("grad").num_rows > 0  # msprobe grad_probe: read once, kept by the dump


def has_params(dump: Dump) -> bool:
    return dump.format == "rlprobe" and bool(dump.parts("param"))
