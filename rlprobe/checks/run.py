"""`rlprobe check DUMP`: what is wrong inside one run, no baseline needed. Builds the input
tables (rlprobe/checks/inputs.py, token_tables.py), runs every registered check's query and
returns the results as tables; rendering and publishing are rlprobe/report's (check_report.py).

Exit codes: 0 every applicable check passed (warnings included), 1 a check failed, 3 the dump
cannot be read (raised as DumpReadError)."""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rlprobe.checks import inputs
from rlprobe.checks.registry import CHECKS, Check, check_params
from rlprobe.errors import DumpReadError
from rlprobe.lake.reader import Dump, open_dump
from rlprobe.lake.sql_runner import query_params, run

EXIT_OK, EXIT_FAILED, EXIT_UNREADABLE = 0, 1, 3
RESULTS = pa.schema([("check", pa.string()), ("title", pa.string()), ("severity", pa.string()),
                     ("status", pa.string()), ("rows", pa.int64()), ("level", pa.string()), ("first", pa.string()),
                     ("note", pa.string()), ("query", pa.string())])
TOKEN_NOTE = "token-level figures need tensors (this dump holds statistics only): checked on statistics"


@dataclass
class CheckResult:
    dump: str
    exit_code: int
    results: pa.Table  # one row per check (RESULTS)
    rows: dict[str, pa.Table]  # each check's offending rows
    tables: dict[str, pa.Table]  # the token-level and gradient tables the checks read
    info: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for status in self.results["status"].to_pylist():
            counts[status] = counts.get(status, 0) + 1
        return {"dump": self.dump, "exit_code": self.exit_code, "counts": counts, "run": self.info,
                "notes": self.notes, "checks": self.results.to_pylist(),
                "timings_s": {k: round(v, 4) for k, v in self.timings.items()}}


def check_dump(dump: Dump | Any, params: dict[str, Any] | None = None, only: tuple[str, ...] | None = None,
               con: Any = None, maxima_only: bool = False, key_names: Mapping[str, str] | None = None,
               key_map: Mapping[str, str] | None = None) -> CheckResult:
    """Run every check (or those named in `only`) on one dump (a path or an open Dump). Raises
    DumpReadError when it cannot be read and ValueError for an unknown parameter or check.
    `con`: a DuckDB connection of the caller's that the check's tables are registered in (compare passes
    a cursor of its own: duckdb.connect() starts a database each time, ~25 ms of CPU, a cursor ~20 µs).
    The two-run verdict reads the same rules: check_dump(dump, only=("on_policy", "rollout_vs_recompute")).rows;
    with `only`, the token tables hold the pairs those checks read, not every pair (token_rows.selection_for), and
    with `maxima_only` too, the on_policy pairs only their token count and max |Δ|, what its query reads
    (token_maxima.py: the rules' results are the same, their token tables lean). `key_names`: saved key ->
    canonical key, as a comparison reads both its runs (default: rlprobe/key_names.csv, decided by this dump's keys,
    with a user's `key_map` over it: a pipeline's key_map:)."""
    import duckdb

    params = dict(params or {})
    names = {c.name for c in CHECKS}
    if only is not None and not set(only) <= names:
        raise ValueError(f"unknown check(s) {sorted(set(only) - names)}; expected some of {sorted(names)}")
    check_params(params)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    dump = dump if isinstance(dump, Dump) else open_dump(dump)
    stats = inputs.stats_table(dump, key_names, key_map)
    scalars = dump.arrow("scalar")
    configs = dump.configs()
    info = inputs.run_info(dump, stats, configs, params)
    grad_steps = inputs.grad_steps(dump)
    timings["read"] = time.perf_counter() - t
    t = time.perf_counter()
    tables: dict[str, pa.Table] = {"grad_steps": grad_steps}
    if info["has_tensors"]:
        from rlprobe.checks.pair_index import samples_table
        from rlprobe.checks.token_rows import selection_for
        from rlprobe.checks.token_tables import GROUPS, group_advantages, token_tables

        # only the pairs the checks run read (token_rows.selection_for); the full check reduces all: its reports show them
        selection = None if only is None else selection_for(only, stats, info)
        with collections_paused():
            samples = samples_table(dump, inputs.key_canonical(stats))
            workers = int(params.get("workers") or 2)
            if maxima_only and selection is not None:
                from rlprobe.checks.token_maxima import lean_token_tables

                tables.update(lean_token_tables(dump, stats, info["eps"], workers, samples, selection))
            else:
                tables.update(token_tables(dump, stats, info["eps"], workers, samples, selection))
            # every advantages tensor is read for it: only where a check run reads the table (one does:
            # sql/check/grpo_advantages.sql; compare's single-run rules do not)
            tables["group_advantages"] = (group_advantages(dump, stats, info["group_size"], samples)
                                          if only is None or "grpo_advantages" in only else GROUPS.empty_table())
    else:
        from rlprobe.checks import token_tables as tt

        tables.update({"token_steps": tt.STEPS.empty_table(), "token_hist": tt.HIST.empty_table(),
                       "token_positions": tt.BUCKETS.empty_table(), "token_probability": tt.BUCKETS.empty_table(),
                       "token_sequences": tt.SEQUENCES.empty_table(), "group_advantages": tt.GROUPS.empty_table()})
    timings["tokens"] = time.perf_counter() - t
    t = time.perf_counter()
    con = con or duckdb.connect()
    con.register("stats", stats)  # scanned in place: copying it into a DuckDB table costs more than it saves
    con.register("scalars", scalars)
    con.register("configs", dump.configs_table())
    con.register("run_info", inputs.run_info_table(info))
    for name, table in tables.items():
        con.register(name, table)
    facts = _facts(con, scalars, info, grad_steps)
    facts["group_rows"] = tables["group_advantages"].num_rows
    results, rows = [], {}
    for check in CHECKS:
        if only is not None and check.name not in only:
            continue
        results.append(_run_check(con, check, facts, params, info, dump, rows))
    timings["sql"] = time.perf_counter() - t
    table = pa.Table.from_pylist(results, schema=RESULTS)
    failed = any(r["status"] == "fail" for r in results)
    notes = [TOKEN_NOTE] if stats.num_rows and not info["has_tensors"] else []  # an empty dump has no statistics either
    return CheckResult(str(dump.path), EXIT_FAILED if failed else EXIT_OK, table, rows, tables, info, notes, timings)


@contextmanager
def collections_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the token phase: it builds thousands of small
    objects (tensor index rows, parts) and no reference cycles, and a full collection in the middle
    (every object pyarrow and duckdb made at import, ~150,000) cost ~70 ms of a ~80 ms phase."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Facts(dict):
    """What the checks' `applies` read; a fact that needs a query of its own is computed when a check
    first reads it (check_dump(only=...) runs a few checks: no query only the others need)."""

    def __init__(self, known: dict[str, Any], later: dict[str, Callable[[], Any]]):
        super().__init__(known)
        self._later = later

    def __missing__(self, name: str) -> Any:
        if name not in self._later:
            raise KeyError(name)
        value = self[name] = self._later[name]()
        return value


def _facts(con, scalars: pa.Table, info: dict[str, Any], grad_steps: pa.Table) -> _Facts:
    saved = con.sql("SELECT DISTINCT key, canonical FROM stats WHERE NOT coalesce(absent, false)").fetchall()
    keys = {canonical for _, canonical in saved}
    names = set(pc.unique(scalars["name"]).to_pylist()) if scalars.num_rows else set()
    loss_names = {k for k in {key for key, _ in saved} | names if k.endswith("loss")}
    ref = functools.cache(lambda: run(con, "check/ref_starts_as_actor.sql").to_pylist()[0])
    return _Facts({"keys": keys, "scalars": names, "loss_names": loss_names, "group_size": info["group_size"],
                   "has_tensors": info["has_tensors"], "entropy_scalars": any("entropy" in n for n in names),
                   "grad_steps": grad_steps.num_rows},
                  {"kl_applies": lambda: bool(ref()["applies"]), "ref_declared": lambda: bool(ref()["declared"]),
                   "rollout_pairs": lambda: bool(run(con, "check/rollout_pairs.sql").to_pylist()[0]["pairs"]),
                   "sign_steps": lambda: int(pc.sum(pc.is_valid(grad_steps["sign_agreement"])).as_py() or 0)})


def _run_check(con, check: Check, facts: dict[str, Any], params: dict[str, Any], info: dict[str, Any], dump: Dump,
               rows: dict[str, pa.Table]) -> dict[str, Any]:
    row = {"check": check.name, "title": check.title, "severity": check.severity, "rows": 0, "level": None,
           "first": None, "note": None, "query": f"sql/check/{check.query}"}
    why_not = check.applies(facts)
    if why_not is not None:
        return {**row, "status": "not_applicable", "note": why_not}
    mine = {k: v for k, v in params.items() if k in query_params(f"check/{check.query}")}
    found = run(con, f"check/{check.query}", **mine)
    rows[check.name] = found
    if check.token_level:
        row["level"] = "tokens" if info["has_tensors"] else "statistics"
        if not info["has_tensors"]:
            row["note"] = TOKEN_NOTE
    if found.num_rows == 0:
        return {**row, "status": "pass"}
    first = found.slice(0, 1).to_pylist()[0]
    if check.name == "nonfinite" and first.get("source") == "key_data" and info["has_tensors"]:
        first["element"] = _first_nonfinite_element(dump, first)
    text = ", ".join(f"{k}={_fmt(v)}" for k, v in first.items() if v is not None)
    return {**row, "status": check.severity, "rows": found.num_rows, "first": text}


def _first_nonfinite_element(dump: Dump, row: dict[str, Any]) -> str | None:
    """The position of the first NaN/inf element of the saved tensor (None without a tensor)."""
    try:
        x = dump.tensor(row["name"], row["step"], row["rank"], row["micro_step"], row["index"])
    except DumpReadError:  # statistics-only rows have no tensor; the row itself is the finding
        return None
    if not np.issubdtype(x.dtype, np.floating):
        return None
    bad = np.flatnonzero(~np.isfinite(x))
    if bad.size == 0:
        return None
    return str(tuple(int(i) for i in np.unravel_index(int(bad[0]), x.shape))) if x.ndim else "()"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
