"""A control run's noise envelope (docs/across-devices.md, "A control run"): run C differs from run A only by
noise (A's code rerun without determinism, or on B's device with a version known to be good). A against
C is compared first, key data only, by the same engine and options; per (canonical key, step), the largest
max-norm relative error of A vs C (norm_rel_err: statistics-only rows' largest statistic difference) times
FACTOR is the envelope that sql/key_data.sql judges A against B by, besides the dtype tolerance: a pair is
close where its error is within either. Exact keys (tokens, integers) take no envelope. Where C's tokens
part from A's (sampling under its noise), C is no noise-only control from that step on: its envelope
stops there, and the summary says so."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa

from rlprobe.comparison.key_data import ENVELOPE_SCHEMA, compare_key_data
from rlprobe.comparison.options import CompareOptions
from rlprobe.comparison.tolerance import EXACT_FAMILIES, FAMILIES
from rlprobe.errors import ControlRunError, DumpReadError, SelectionError
from rlprobe.lake.reader import Dump, open_dump
from rlprobe.lake.sql_runner import records, run

# How far B's error may exceed C's and still be noise: of two independent noise draws of one kind against run
# A, one draw's max-norm error (per key and step, where beyond float32's tolerance) was at most 4.6 times the
# other's (TF32 inputs; 3.75 for a reordered float32 sum, 7 where both are within the tolerance), measured on
# the PPO example (benchmarks/tolerance_noise.py --draws 5, docs/across-devices.md): the next power of two
# above both
FACTOR = 8.0


@dataclass(frozen=True)
class NoiseEnvelope:
    """The table key_envelope (canonical key, step, control_rel_err, envelope = FACTOR x it, source) of control run
    `path`, the step from which C's tokens part from A's (None: they never do), and what of A or C could not be
    read in their comparison."""

    path: str
    table: pa.Table
    factor: float = FACTOR
    parted: dict[str, Any] | None = None
    read_errors: tuple[str, ...] | list[str] = ()

    @property
    def parted_warning(self) -> str | None:
        """The words on C's tokens parting from A's (None: they never do)."""
        if self.parted is None:
            return None
        step = self.parted["step"]
        return (f"the control run's {self.parted['key']!r} differs from run A's from step {step} (its tokens "
                f"parted: {self.parted['status']}): it is no noise-only control from then on, so steps from {step} "
                f"on are judged by the dtype tolerances only")

    def warnings(self) -> list[str]:
        """The summary's warnings of this control run: tokens that parted, parts that could not be read."""
        return ([self.parted_warning] if self.parted_warning else []) + list(self.read_errors)

    def summary(self) -> dict[str, Any]:
        """summary.json's `control` (its warnings are among the summary's warnings too: warnings())."""
        return {"path": self.path, "factor": self.factor, "parted": self.parted, "warning": self.parted_warning,
                "read_errors": list(self.read_errors), "envelope": self.table.drop_columns(["source"]).to_pylist()}


def noise_envelope(dump_a: Dump, control: Any, options: CompareOptions,
                   executor: Callable[..., Any] | None = None) -> NoiseEnvelope:
    """The envelope of control run `control` (a path) against `dump_a`, compared with `options`' selection,
    tolerance, order and key map (its own DuckDB connection). ControlRunError naming the path where it is
    not a readable dump or holds no key data in common with run A."""
    import duckdb

    path = os.fspath(control)
    expected = ("expected a dump of the baseline's code rerun with noise only (without determinism, or on "
                "the candidate's device with a version known to be good)")
    try:
        dump_c = open_dump(control)
    except DumpReadError as e:
        raise ControlRunError(f"control run {path}: {e}; {expected}") from None
    con = duckdb.connect()
    try:
        try:
            compared = compare_key_data(con, dump_a, dump_c, keys=options.keys, steps=options.steps,
                                        ranks=options.ranks, workers=options.workers,
                                        tolerance=options.tolerance, order=options.order, executor=executor,
                                        key_map=dict(options.key_map) if options.key_map is not None else None)
        except (DumpReadError, SelectionError) as e:
            raise ControlRunError(f"control run {path}: {e}") from None
        common = records(con, "control_common.sql")[0]
        if not common["rows"]:
            unread = "".join(f"; {e}" for e in compared.read_errors)  # run B: the control
            raise ControlRunError(
                f"control run {path}: no key data in common with run A {dump_a.path} (A holds "
                f"{common['keys_a'] or 'no key data'}, the control {common['keys_c'] or 'no key data'}, in the "
                f"selection{unread}); {expected}, saving the same keys at the same steps")
        tokens = [key for family in EXACT_FAMILIES for key in FAMILIES[family]]
        parted = records(con, "control_parted.sql", tokens=tokens)
        parted = parted[0] if parted else None
        table = run(con, "key_envelope.sql", factor=FACTOR, source=f"control run x{FACTOR:g}",
                    parted_step=None if parted is None else parted["step"])
    finally:
        con.close()  # A-vs-C's tables: only key_envelope is kept
    # parts of either run that could not be read: their keys take the dtype tolerance (named among the warnings)
    unread = [f"control run {path} (compared with A as run B): {e}" for e in compared.read_errors]
    return NoiseEnvelope(path, table.cast(ENVELOPE_SCHEMA), FACTOR, parted, unread)
