"""The key-data comparison: both runs' statistics matched row by row in SQL, the tensor pairs
compared element-wise by the pair executor, each row's status, and the first divergence."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import pyarrow as pa

from rlprobe.comparison.key_aliases import key_order_table
from rlprobe.comparison.pair_results import AHEAD_MIN_PAIRS, pair_results_table
from rlprobe.comparison.sample_alignment import layout, sample_key_data
from rlprobe.comparison.tolerance import Tolerance
from rlprobe.errors import SelectionError
from rlprobe.lake.reader import Dump
from rlprobe.lake.schema import KEY_DATA, with_rank
from rlprobe.lake.sql_runner import create_table, execute, records, run, store
from rlprobe.lake.tensor_pack import split_address

Progress = Callable[[int, int], None]
# columns of key_data that the reports leave out (file paths, ordering)
PRIVATE_COLUMNS = ("file_a", "file_b", "canonical_key", "flow_position", "control_envelope")
# the table key_envelope that key_data.sql judges pairs by besides their tolerance: a control run's noise per
# (canonical key, step), made by control_run.py; empty without a control run
ENVELOPE_SCHEMA = pa.schema([("key", pa.string()), ("step", pa.int64()), ("control_rel_err", pa.float64()),
                             ("envelope", pa.float64()), ("source", pa.string())])
_NO_FILES = pa.table({"file_a": pa.array([], pa.string()), "file_b": pa.array([], pa.string())})


@dataclass
class KeyDataComparison:
    """key_data (one row per pair, `is_first_divergence` marked), its first divergence beyond tolerance
    (None: none) and first bitwise difference (first_difference, within rounding or not), the parts that could not be read (as messages), how many tensor pairs (or sample pairs)
    were compared element-wise, and both runs' layouts (summary.json's `layout`)."""

    table: pa.Table
    first: dict[str, Any] | None
    read_errors: list[str]
    pairs_compared: int
    layout: dict[str, Any]
    first_difference: dict[str, Any] | None = None


def compare_key_data(con: Any, dump_a: Dump, dump_b: Dump, *, keys: list[str] | None = None,
                     steps: list[int] | None = None, ranks: list[int] | None = None, workers: int = 2,
                     tolerance: Tolerance | None = None, order: list[str] | None = None,
                     progress: Progress | None = None,
                     executor: Callable[..., dict] | None = None,
                     key_map: dict[str, str] | None = None,
                     ahead: Callable[[list[Any]], None] | None = None,
                     stats_read: Callable[[], None] | None = None,
                     envelope: pa.Table | None = None) -> KeyDataComparison:
    """Compare the key data of `dump_a` and `dump_b` in `con`, which keeps the tables stats_a,
    stats_b, key_order and key_data (and the macros of pair_macros.sql) for the queries after it.
    Runs with different layouts (micro-batches, ranks) are compared per sample (sample_alignment.py).
    `ahead(tasks)`: starts comparing pairs (PairTask) that `executor` will then be asked for, while
    the statistics are read (rlprobe.comparison.pair_results); called for two msprobe dumps (run A of many
    tensor files) without a selection. `stats_read()` is called once both runs' statistics are loaded.
    `tolerance`: when a pair that is not bitwise equal is close (tolerance.py; default: per dtype); `envelope`:
    a control run's key_envelope (control_run.py; ENVELOPE_SCHEMA), by which a pair is close too (default: none)."""

    tolerance = tolerance or Tolerance()
    read_errors: list[str] = []
    if dump_a.format == "msprobe":  # run B's statistics read in a second process while run A's are read here
        dump_b.reading_ahead.start()
    try:
        load_stats(con, "stats_a", dump_a, read_errors, "A")
    except BaseException:
        dump_b.reading_ahead.stop()
        raise
    load_stats(con, "stats_b", dump_b, read_errors, "B")
    if keys is not None or steps is not None or ranks is not None:
        check_selection(con, keys, steps, ranks)
    if ahead is not None and keys is None and steps is None and ranks is None:
        _start_ahead(ahead, dump_a, dump_b)
    if stats_read is not None:
        stats_read()
    saved = saved_keys(con)  # both runs' keys decide the ambiguous names (rlprobe/key_names.csv)
    con.register("key_order", key_order_table(order, key_map, saved["A"] | saved["B"]))
    con.register("key_tolerance", tolerance.table(  # each (key, dtype) the runs saved, as its tolerance judges it
        (r["key"], r["canonical"], r["dtype"]) for r in records(con, "saved_dtypes.sql")))
    con.register("key_envelope", ENVELOPE_SCHEMA.empty_table() if envelope is None else envelope)
    run_layout = layout(con, dump_a, dump_b, read_errors)
    execute(con, "pair_macros.sql")
    execute(con, "key_data_pairs.sql")
    selection = {"keys": keys, "steps": steps, "ranks": ranks}

    # only rows with a tensor file on both sides (and equal shapes) are compared element-wise;
    # a statistics-only dump has none, so its pairs are never looked at twice
    files = _NO_FILES  # row i: pair i's file_a and file_b
    if not run_layout["per_sample"]:
        create_table(con, "selected_pairs", "selected_pairs.sql", **selection)  # for tensor_pairs and key_data
        if records(con, "has_tensor_files.sql")[0]["both_have_files"]:
            files = run(con, "tensor_pairs.sql")
    pairs = files.num_rows
    results: dict[int, dict[str, Any]] = {}
    if files.num_rows:  # the executor is imported only when there is a pair to compare
        from rlprobe.comparison.executor import run_pairs

        root_a, root_b = os.path.join(dump_a.path, ""), os.path.join(dump_b.path, "")  # no pathlib per pair
        tasks = _pair_tasks(files, root_a, root_b)
        results = (executor or run_pairs)(tasks, workers=workers, progress=progress)
        del tasks  # each pair's paths and records: not held through key_data.sql (issue 42, item 6)
    elif progress is not None:
        progress(0, 0)
    gathered = 0
    if run_layout["per_sample"]:  # judged by the layout tolerance, not by an envelope
        key_data, gathered = sample_key_data(con, dump_a, dump_b, selection, read_errors)
        key_data = key_data.append_column("control_envelope", pa.nulls(key_data.num_rows, pa.float64()))
    else:
        pair_results = pair_results_table(results, files)
        del results, files  # the executor's columns and the pairs' addresses: key_data.sql reads pair_results
        con.register("pair_results", pair_results)
        try:
            key_data = run(con, "key_data.sql")
        finally:
            con.unregister("pair_results")
            del pair_results
    key_data = _prepend_read_errors(key_data, read_errors)
    con.register("key_data", key_data)
    first = records(con, "first_divergence.sql")
    first = first[0] if first else None
    difference = records(con, "first_difference.sql")  # the first bitwise difference, within rounding or not
    difference = difference[0] if difference else None
    if first is not None:
        first["kind"] = "key_data"
        canonical = records(con, "canonical_key.sql", key=first["key"])
        first["canonical_key"] = canonical[0]["canonical"] if canonical else first["key"]
    key_data = _mark_first(key_data, first)
    con.register("key_data", key_data)
    return KeyDataComparison(key_data, first, read_errors, pairs + gathered, run_layout, difference)


def saved_keys(con: Any) -> dict[str, set[str]]:
    """The keys each run saved ("A", "B": its statistics tables stats_a and stats_b in `con`)."""
    return {side: {row[0] for row in con.table(table).project("key").distinct().fetchall()}
            for side, table in (("A", "stats_a"), ("B", "stats_b"))}


def check_selection(con: Any, keys: list[str] | None, steps: list[int] | None, ranks: list[int] | None) -> None:
    """Raise SelectionError when the selection names a key that neither run saved (stats_a, stats_b in `con`) or
    matches none of their rows; runs without key data (gradients or modules only) take any selection."""
    found = records(con, "selection_matches.sql", keys=keys, steps=steps, ranks=ranks)[0]
    if not found["rows"]:
        return
    saved = found["keys"]
    holds = (f"the runs hold keys {_listed(saved)}, steps {found['first_step']}-{found['last_step']}, "
             f"ranks {_listed(found['ranks'])}")
    known = set(saved)
    missing = [k for k in keys or [] if k not in known]
    if missing:
        raise SelectionError(f"selected key(s) {_listed(missing)} saved by neither run (keys are matched as "
                             f"saved, before any key map); {holds}")
    if not found["selected"]:
        chosen = [f"{what} {_listed(values)}" for what, values in (("keys", keys), ("steps", steps), ("ranks", ranks))
                  if values is not None]
        raise SelectionError(f"the selection ({'; '.join(chosen)}) matches no key data of either run; {holds}")


def _listed(values: list[Any], most: int = 12) -> str:
    """`values` comma-separated, at most `most` of them (then how many more)."""
    shown = ", ".join(str(v) for v in values[:most])
    return shown + (f" and {len(values) - most} more" if len(values) > most else "") if values else "(none)"


def _start_ahead(ahead: Callable[[list[Any]], None], dump_a: Dump, dump_b: Dump) -> None:
    """`ahead` the pairs of the tensor files of msprobe dump A (its table's: both runs' statistics are read by
    now) with the file under the same path in dump B, from AHEAD_MIN_PAIRS of them on: they are compared while
    the layout and pairing SQL run (a pair whose B file is missing fails at once, and the SQL never picks it)."""
    if dump_a.format != "msprobe" or dump_b.format != "msprobe":
        return
    try:
        files = dump_a.msprobe_tensor_files()
    except OSError:
        return
    if len(files) < AHEAD_MIN_PAIRS:
        return
    from rlprobe.comparison.executor import PairTask

    root_a, root_b = os.path.join(dump_a.path, ""), os.path.join(dump_b.path, "")
    ahead([PairTask(i, root_a + f, root_b + f) for i, f in enumerate(files)])


def _pair_tasks(files: pa.Table, root_a: str, root_b: str) -> Sequence[Any]:
    """The executor's tasks of tensor_pairs.sql's rows (task i: row i), as columns (comparison/pair_results.py:
    no Python object a pair until one is asked for), each column's addresses split by Arrow, TASK_ROWS at a time.
    Where a column's addresses are not all whole files or all records (`<file>.npys#<offset>+<length>`,
    lake/tensor_pack.split_address), pairs are split one by one as before, into a list."""
    from rlprobe.comparison.pair_results import PairColumns

    sides = [_side(files[column], root) for column, root in (("file_a", root_a), ("file_b", root_b))]
    if None in sides:
        return _pair_tasks_one_by_one(files, root_a, root_b)
    return PairColumns(*sides)


# addresses split at once: Arrow's split of a column holds ~0.5 KB a pair while it runs, so the whole column at
# once grew a 409,600-pair comparison's peak by ~0.2 GB; a slice of these bounds it (issue 42, item 6)
TASK_ROWS = 65_536


def _side(addresses: pa.ChunkedArray, root: str) -> Any:
    """One side's Side (pair_results.py) of `addresses`, `root` before each path; None where they are not all
    records of packed files (nor all whole files)."""
    import numpy as np
    import pyarrow.compute as pc

    from rlprobe.comparison.pair_results import Side
    from rlprobe.lake.tensor_pack import PACK_SUFFIX

    if not pc.any(pc.match_substring(addresses, "#")).as_py():  # whole files
        return Side([root + a for a in addresses.to_pylist()])
    paths: list[str] = []
    prefixed: dict[str, str] = {}  # a packed file holds many records: its path made once
    offsets, lengths = [], []
    for start in range(0, len(addresses), TASK_ROWS):
        rows = addresses.slice(start, TASK_ROWS).combine_chunks()
        file_place = pc.split_pattern(rows, "#", max_splits=1, reverse=True)  # as str.rpartition
        if not pc.all(pc.equal(pc.list_value_length(file_place), 2)).as_py():
            return None
        place = pc.split_pattern(pc.list_element(file_place, 1), "+", max_splits=1)  # as str.partition
        if not pc.all(pc.equal(pc.list_value_length(place), 2)).as_py():
            return None
        file, offset, length = pc.list_element(file_place, 0), pc.list_element(place, 0), pc.list_element(place, 1)
        taken = pc.ends_with(file, PACK_SUFFIX)
        for digits in (offset, length):  # what int() reads as split_address does, within int64
            size = pc.utf8_length(digits)
            taken = pc.and_(taken, pc.and_(pc.ascii_is_decimal(digits),
                                           pc.and_(pc.greater(size, 0), pc.less_equal(size, 18))))
        if not pc.all(taken).as_py():
            return None
        distinct = pc.dictionary_encode(file)
        names = [prefixed.setdefault(f, root + f) for f in distinct.dictionary.to_pylist()]
        paths.extend(map(names.__getitem__, distinct.indices.to_numpy().tolist()))
        offsets.append(offset.cast(pa.int64()).to_numpy(zero_copy_only=False))
        lengths.append(length.cast(pa.int64()).to_numpy(zero_copy_only=False))
    return Side(paths, np.concatenate(offsets), np.concatenate(lengths))


def _pair_tasks_one_by_one(files: pa.Table, root_a: str, root_b: str) -> list[Any]:
    pairs = zip(files["file_a"].to_pylist(), files["file_b"].to_pylist())  # columns, not a dict per row
    return [_pair_task(i, root_a, file_a, root_b, file_b) for i, (file_a, file_b) in enumerate(pairs)]


def _pair_task(i: int, root_a: str, address_a: str, root_b: str, address_b: str) -> Any:
    """The executor's task of a pair of tensor addresses (a file, or a record of a packed file)."""
    from rlprobe.comparison.executor import PairTask

    if "#" not in address_a and "#" not in address_b:  # whole files (no parsing per pair)
        return PairTask(i, root_a + address_a, root_b + address_b)
    file_a, record_a = split_address(address_a)
    file_b, record_b = split_address(address_b)
    return PairTask(i, root_a + file_a, root_b + file_b, record_a, record_b)


def load_stats(con: Any, name: str, dump: Dump, read_errors: list[str], side: str) -> None:
    """One run's key-data statistics of committed steps as the DuckDB table `name` (rank column
    included; a column that older parts lack, such as `absent`, reads as null).

    rlprobe dumps: parts whose footer cannot be read or whose columns are not key data's are
    left out, each a message in `read_errors`; DuckDB reads the others at once, and if that fails
    (a corrupt data page), they are read one by one, and each unreadable one is a message too."""
    schema = with_rank(KEY_DATA)
    if dump.format == "rlprobe":
        errors: list[str] = []
        parts = dump.checked_parts("key_data", errors)
        files = [f for fs in parts.values() for f in fs]
        if files:
            import duckdb

            helpers = {"_part_rank": pa.table({"filename": pa.array(files, pa.string()),
                                               "rank": pa.array([r for r, fs in parts.items() for _ in fs],
                                                                pa.int64())}),
                       "_key_data_columns": KEY_DATA.empty_table(),
                       "_committed": dump.committed_table("key_data")}  # committed steps only, as rlprobe.open
            for helper, table in helpers.items():
                con.register(helper, table)
            try:
                create_table(con, name, "key_data_stats.sql", files=files, columns=schema.names)
                read_errors.extend(f"run {side}: {e}" for e in errors)
                return
            except duckdb.Error:
                pass  # a corrupt data page (DuckDB names no file): read part by part below, to name it
            finally:
                for helper in helpers:
                    con.unregister(helper)
    errors = []  # arrow() checks the parts again and names each one it cannot read
    table = dump.arrow("key_data", errors=errors)
    read_errors.extend(f"run {side}: {e}" for e in errors)
    store(con, name, table.select(schema.names) if table.num_rows else schema.empty_table())


def public_key_data(key_data: pa.Table) -> pa.Table:
    """key_data as the reports show it: without the internal file and ordering columns."""
    return key_data.drop_columns([c for c in PRIVATE_COLUMNS if c in key_data.column_names])


def _prepend_read_errors(key_data: pa.Table, read_errors: list[str]) -> pa.Table:
    """An unreadable stats part becomes an error row (step -1, so it is the first thing to fix)."""
    if not read_errors:
        return key_data
    rows = [{"key": "(unreadable stats)", "step": -1, "rank": -1, "micro_step": -1, "index": str(i),
             "status": "error", "message": msg, "canonical_key": "(unreadable stats)", "flow_position": -1}
            for i, msg in enumerate(read_errors)]
    extra = pa.Table.from_pylist(rows, schema=pa.schema([key_data.schema.field(c) for c in rows[0]]))
    return pa.concat_tables([extra, key_data], promote_options="default")


def _mark_first(key_data: pa.Table, first: dict[str, Any] | None) -> pa.Table:
    """key_data with is_first_divergence: true on the first row equal to `first` (by key)."""
    import pyarrow.compute as pc

    n = key_data.num_rows
    hit = -1
    if first is not None and n:
        mask = None
        for c in ("key", "step", "rank", "micro_step", "index"):
            value = first[c]
            eq = pc.is_null(key_data[c]) if value is None else pc.fill_null(pc.equal(key_data[c], value), False)
            mask = eq if mask is None else pc.and_(mask, eq)
        hit = pc.index(mask, True).as_py()
    # from Arrow scalars, not a numpy array: pa.array(ndarray) imports numpy.ma (~10-30 ms of start-up)
    flags = (pa.concat_arrays([pa.repeat(False, hit), pa.array([True]), pa.repeat(False, n - hit - 1)]) if hit >= 0
             else pa.repeat(False, n))
    return key_data.append_column("is_first_divergence", flags)
