"""The whole comparison of two runs, in memory: key data, then modules and gradients where the
dumps hold them; returns the result tables and the summary. It reads the lake and writes
nothing: `rlprobe compare` and pipelines hand its tables to the report writers
(rlprobe.report.output_folder)."""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa

from rlprobe._version import __version__
from rlprobe.comparison.amplification import KeyErrors
from rlprobe.comparison.key_data import compare_key_data, saved_keys
from rlprobe.comparison.options import CompareOptions, Runtime, has_grads, has_module_stats, has_params
from rlprobe.comparison.pair_results import PairsAhead
from rlprobe.comparison.sample_alignment import modules_not_compared
from rlprobe.comparison.single_run import single_run_findings
from rlprobe.comparison.verdict import explain, explain_beyond_key_data, settle_parting
from rlprobe.lake.reader import Dump
from rlprobe.lake.sql_runner import bound_memory, records, run, to_arrow

if TYPE_CHECKING:
    import duckdb

Progress = Callable[[int, int], None]
# summary.json's first_divergence (and first_difference, without kind)
FIRST_FIELDS = ("kind", "key", "step", "rank", "micro_step", "index", "status", "max_abs_err", "max_rel_err",
                "norm_rel_err", "rtol", "atol", "tolerance_source", "envelope", "message")


def compare_dumps(dump_a: Dump, dump_b: Dump, options: CompareOptions | None = None,
                  runtime: Runtime | None = None) -> tuple[dict[str, pa.Table], dict[str, Any]]:
    """The comparison itself, in memory: (tables by name, summary). `options`: what to compare and how
    (comparison/options.py: selection, workers, tolerance, key map, config ignore list, gradient and module
    settings; default CompareOptions()); `runtime`: how the caller takes part (the same module: progress, the
    executor of the pairs, the DuckDB connection, what runs beside the pairs; default Runtime())."""
    options = options or CompareOptions()
    runtime = runtime or Runtime()
    keys, steps, ranks, workers = options.keys, options.steps, options.ranks, options.workers
    key_map = dict(options.key_map) if options.key_map is not None else None
    order = options.order
    progress, executor, con = runtime.progress, runtime.executor, runtime.con
    import duckdb

    own_connection = con is None
    con = con or (runtime.connect or duckdb.connect)()
    if own_connection:  # the database's tables and sorts spill beyond its limit: memory flat in the pairs
        bound_memory(con)  # (a connection the caller opened keeps the caller's settings)
    envelope = None
    if options.control is not None:  # run A against the control run first: its noise, per key and step
        from rlprobe.comparison.control_run import noise_envelope

        envelope = noise_envelope(dump_a, options.control, options, executor or _local_run_pairs)
    beside = _SingleRunBeside(con, dump_a, dump_b, executor, start=workers > 1, key_map=key_map,
                              beside_pairs=runtime.beside_pairs)
    try:
        # with more than one worker (and the local executor), pairs known from the runs' folders are compared
        # while their statistics are read (pair_results.PairsAhead)
        compared = compare_key_data(con, dump_a, dump_b, keys=keys, steps=steps, ranks=ranks, workers=workers,
                                    tolerance=options.tolerance, order=order, progress=progress,
                                    executor=beside.run_pairs, key_map=key_map,
                                    ahead=partial(beside.start_ahead, workers=workers)
                                    if workers > 1 and executor is None else None, stats_read=beside.stats_read,
                                    envelope=None if envelope is None else envelope.table)
    except BaseException:
        beside.wait(quiet=True)  # the comparison's own error is the one to report
        raise
    beside.drop_ahead()  # pairs compared ahead that the comparison did not ask for (none, as a rule)
    first, read_errors = compared.first, compared.read_errors
    if runtime.key_data_ready is not None:
        runtime.key_data_ready(compared.table)

    if beside.started:
        within = beside.wait()
    else:  # each run against itself (rlprobe check)
        within = single_run_findings({"A": dump_a, "B": dump_b}, saved_keys(con), _cursors(con), key_map)
    from rlprobe.comparison.config_diff import diff_configs, reward_source
    from rlprobe.comparison.amplification import shared_prefix_log_probs

    config_diff = diff_configs(dump_a, dump_b, ignore=options.config_ignore,
                               ignore_defaults=options.config_ignore_defaults, read_errors=read_errors)
    verdict = explain(first, KeyErrors(con, [first["step"]]) if first is not None else None, within,
                      compared.first_difference, config_diff=config_diff, reward_source=partial(reward_source, dump_a, dump_b),
                      shared_prefix=partial(shared_prefix_log_probs, dump_a, dump_b, compared.table,
                                            tolerance=options.tolerance))
    if first is not None:
        earliest = records(con, "earliest_in_step.sql", step=first["step"])
        if earliest and earliest[0]["micro_step"] < first["micro_step"]:
            e = earliest[0]
            verdict["suspect"] += (f"; note: within step {e['step']}, {e['key']} already differs at micro_step "
                                   f"{e['micro_step']}, before this micro-batch")

    key_rollup = run(con, "key_rollup.sql")
    if envelope is None:  # the envelope column is a control run's (summary.json's keys as before without one)
        key_rollup = key_rollup.drop_columns(["envelope"])
    step_rollup = run(con, "step_rollup.sql")
    counts = {r["status"]: r["rows"] for r in records(con, "status_counts.sql")}
    summary = {
        "rlprobe_version": __version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run_a": str(dump_a.path), "run_b": str(dump_b.path),
        "format_a": dump_a.format, "format_b": dump_b.format,
        "control": None if envelope is None else envelope.summary(),
        "first_divergence": None if first is None else {
            k: first.get(k) for k in FIRST_FIELDS},
        "first_difference": None if compared.first_difference is None else {
            k: compared.first_difference.get(k) for k in FIRST_FIELDS if k != "kind"},
        "module_first_divergence": None,
        "grad_first_flagged": None,
        "param_first_difference": None,
        "update_noise": None,
        **verdict,
        "on_policy_recompute": within.on_policy,
        "rollout_vs_trainer": within.rollout,
        "gates": [],
        "counts": counts,
        "keys": key_rollup.to_pylist(),
        "steps": step_rollup.to_pylist(),
        "read_errors": read_errors,
        "pairs_compared": compared.pairs_compared,
        "layout": compared.layout,
    }
    tables = {"key_data": compared.table, "key_rollup": key_rollup, "step_rollup": step_rollup}
    if own_connection:
        if runtime.stats:
            tables["stats_a"], tables["stats_b"] = to_arrow(con.table("stats_a")), to_arrow(con.table("stats_b"))
    else:
        con.register("key_rollup", key_rollup)
        con.register("step_rollup", step_rollup)
    con.unregister("key_order")
    modules_skipped = modules_not_compared(summary["layout"])  # matched call by call: not under another layout
    if modules_skipped and (has_module_stats(dump_a) or has_module_stats(dump_b)):
        summary["layout"]["modules"] = modules_skipped
        summary["layout"]["note"] = "; ".join(filter(None, (summary["layout"]["note"], modules_skipped)))
    elif has_module_stats(dump_a) or has_module_stats(dump_b):  # module dumps (probe.stage): docs/modules.md
        from rlprobe.comparison.modules import compare_modules, describe

        tables["modules"], summary["module_first_divergence"] = compare_modules(
            dump_a, dump_b, steps=steps, ranks=ranks, workers=workers, progress=progress,
            executor=executor or _local_run_pairs,
            read_errors=read_errors, tolerance=options.tolerance, **(options.modules or {}))
        summary["module_suspect"] = describe(summary["module_first_divergence"])
        summary["suspect"] = summary["suspect"] or summary["module_suspect"]
        from rlprobe.comparison.modules import add_module_weights

        add_module_weights(tables, summary, dump_a, dump_b, tolerance=options.tolerance, steps=steps, ranks=ranks,
                           stages=(options.modules or {}).get("stages"), read_errors=read_errors)
    if has_grads(dump_a) or has_grads(dump_b):  # gradient monitors (probe.monitor_grads): docs/grads.md
        from rlprobe.comparison.grads import compare_grads

        grad_tables, summary["grad_first_flagged"] = compare_grads(dump_a, dump_b, read_errors=read_errors,
                                                                   steps=steps, ranks=ranks, layout=summary["layout"],
                                                                   tolerance=options.tolerance,
                                                                   **(options.grads or {}))
        tables.update(grad_tables)
    explain_beyond_key_data(summary, _grad_probe_step(tables.get("grads"), summary["grad_first_flagged"]))
    if has_params(dump_a) or has_params(dump_b):  # parameter fingerprints (monitor_params): docs/dump-format.md
        from rlprobe.comparison.params import add_param_comparison

        add_param_comparison(tables, summary, dump_a, dump_b, first and first["canonical_key"], read_errors, steps,
                             ranks, options.tolerance, config_diff)
        settle_parting(summary)  # an update that differs before the tokens part is no sampling
    from rlprobe.comparison.config_diff import explain_config, saved_configs
    from rlprobe.comparison.key_aliases import flow_warning
    from rlprobe.comparison.modules import follow_up

    follow_up(summary, tables.get("modules"))  # docs/modules.md: after the module dump; docs/compare.md: config diff
    tables["config_diff"] = config_diff
    explain_config(summary, tables["config_diff"], first and first["canonical_key"], saved_configs(dump_a, dump_b),
                   flow_warning([k["key"] for k in summary["keys"]], key_map, order))
    if modules_skipped and (summary.get("next_config") or {}).get("rlprobe_config", {}).get("stages"):
        summary["advice"] += ("; module dumps are matched call by call, so take the advised dump with both runs on "
                              "one micro-batch layout")
    if envelope is not None and envelope.warnings():  # the console, summary.md and the workbook show them
        summary.setdefault("warnings", []).extend(envelope.warnings())
    # what held rows to compare; [] says "nothing compared" where "no divergence" would claim agreement
    summary["compared"] = [name for name in ("key_data", "modules", "grads", "params")
                           if name in tables and tables[name].num_rows]
    if not summary["compared"] and summary["suspect"] is None:
        summary["advice"] = ("nothing was compared: check that both runs saved something (rlprobe.Probe.save, "
                             "monitor_grads, a module dump) and that A and B are the dumps you meant")
    return tables, summary


def _cursors(con: "duckdb.DuckDBPyConnection") -> dict[str, Any]:
    """A connection of its own on `con`'s database for each run's single-run rules (made on this thread)."""
    return {"A": con.cursor(), "B": con.cursor()}


class _SingleRunBeside:
    """The executor compare_key_data calls once both runs' statistics are loaded (the saved keys
    are then known). With `start`, it starts the single-run rules (single_run.py: each run checked against itself, reading its own
    tensors through its own DuckDB connection) on a second thread before it compares the pairs:
    most of both is compiled kernels, numpy and DuckDB, which release the GIL."""

    def __init__(self, con: "duckdb.DuckDBPyConnection", dump_a: Dump, dump_b: Dump,
                 executor: Callable[..., Any] | None, start: bool, key_map: dict[str, str] | None = None,
                 beside_pairs: Callable[[], None] | None = None):
        self._con = con
        self._beside_pairs = beside_pairs
        self._key_map = key_map  # the single-run rules read the keys as the comparison does
        self._dumps = {"A": dump_a, "B": dump_b}
        self._executor = executor
        self._start = start
        self._thread: threading.Thread | None = None
        self._outcome: tuple[Any, BaseException | None] = (None, None)
        self._ahead: PairsAhead | None = None
        self._importing: threading.Thread | None = None  # started by stats_read (pairs compared ahead)

    def start_ahead(self, tasks: list[Any], workers: int) -> None:
        """Start comparing `tasks` (pair_results.PairsAhead); run_pairs takes them."""
        from rlprobe.comparison.executor import run_pairs

        self._ahead = PairsAhead(tasks, workers, lambda: None, run_pairs)

    def stats_read(self) -> None:
        """Both runs' statistics are loaded: with pairs compared ahead, start the caller's work beside the pairs
        (Runtime.beside_pairs: the command's later imports) now, beside the SQL up to the pairs (DuckDB's, which
        imports nothing and leaves the GIL while a query runs). Not earlier: a thread importing (all Python)
        beside this thread's reading of statistics files (a system call a file, each a switch of the GIL) took
        that reading from 0.1 to 0.3 s of wall."""
        if self._ahead is not None:
            self._importing = self._start_imports()

    def _start_imports(self) -> threading.Thread | None:
        """Runtime.beside_pairs on a thread (run_pairs joins it)."""
        if self._beside_pairs is None:
            return None
        importing = threading.Thread(target=self._beside_pairs, name="rlprobe-beside-pairs", daemon=True)
        importing.start()
        return importing

    def _join_imports(self) -> None:
        importing, self._importing = self._importing, None
        if importing is not None:
            importing.join()

    def drop_ahead(self) -> None:
        """Wait for pairs compared ahead that run_pairs never took (the comparison failed, or asked for none)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.wait()
        self._join_imports()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def run_pairs(self, tasks: Any, **kwargs: Any) -> Any:
        if self._start:
            saved = saved_keys(self._con)  # this thread: the connection is not shared
            self._thread = threading.Thread(target=self._findings, args=(saved, _cursors(self._con)),
                                            name="rlprobe-single-run", daemon=True)
            self._thread.start()
        importing, self._importing = self._importing or self._start_imports(), None
        try:
            if self._executor is None:
                from rlprobe.comparison.executor import run_pairs

                ahead, self._ahead = self._ahead, None
                if ahead is not None:
                    return ahead.take(tasks, lambda rest, progress: run_pairs(rest, **{**kwargs, "progress": progress}),
                                      kwargs.get("progress"))
                return run_pairs(tasks, **kwargs)
            return self._executor(tasks, **kwargs)
        finally:
            if importing is not None:
                importing.join()  # before this thread imports anything itself: no two threads in one import cycle

    def _findings(self, saved: dict[str, set[str]], connections: dict[str, Any]) -> None:
        try:
            self._outcome = (single_run_findings(self._dumps, saved, connections, self._key_map), None)
        except BaseException as exc:  # noqa: BLE001 - raised again by wait(), in the comparison's thread
            self._outcome = (None, exc)

    def wait(self, quiet: bool = False) -> Any:
        """The findings (once the thread is done); its error, if it failed, is raised here (unless `quiet`)."""
        self.drop_ahead()
        if self._thread is None:
            return None
        self._thread.join()
        result, error = self._outcome
        if error is not None and not quiet:
            raise error
        return result


def _local_run_pairs(tasks: Any, **kwargs: Any) -> Any:
    """rlprobe.comparison.executor.run_pairs, imported when a comparison has pairs."""
    from rlprobe.comparison.executor import run_pairs

    return run_pairs(tasks, **kwargs)


def _grad_probe_step(grads: pa.Table | None, flagged: dict[str, Any] | None) -> int | None:
    """The probe step (run A's) at which the first flagged gradient step was taken."""
    if grads is None or flagged is None or "probe_step_a" not in grads.column_names:
        return None
    import pyarrow.compute as pc

    mask = pc.and_(pc.and_(pc.equal(grads["monitor"], flagged["monitor"]), pc.equal(grads["rank"], flagged["rank"])),
                   pc.equal(grads["step"], flagged["step"]))
    steps = grads.filter(mask)["probe_step_a"].drop_null()
    return int(steps[0].as_py()) if len(steps) else None
