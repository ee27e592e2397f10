"""What keeps a comparison's memory from growing with its pairs (issue 42, item 6; docs/performance.md,
"Comparison: memory"): the pairs' addresses split TASK_ROWS at a time (comparison/key_data.py), the database
bounded and spilling (lake/sql_runner.py's bound_memory), a capped key sheet copying only the rows it shows
(report/xlsx.py) and key_data's files rendered into temporary files (report/comparison_files.py)."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rlprobe.comparison import key_data
from rlprobe.comparison.pair_results import PairColumns
from rlprobe.lake import sql_runner
from rlprobe.report import xlsx
from rlprobe.report.comparison_files import KeyDataFiles


def _addresses(n: int) -> pa.Table:
    files = [f"tensors/key_data/rank={i % 3}/steps=0-0.call=0.npys#{1152 * i}+1152" for i in range(n)]
    return pa.table({"file_a": files, "file_b": list(reversed(files))})


def test_pair_addresses_are_split_a_slice_at_a_time(monkeypatch):
    files = _addresses(10)
    whole = key_data._pair_tasks(files, "/a/", "/b/")
    seen: list[int] = []
    split = pc.split_pattern

    def counted(values, *args, **kwargs):
        seen.append(len(values))
        return split(values, *args, **kwargs)

    monkeypatch.setattr(key_data, "TASK_ROWS", 4)
    monkeypatch.setattr(pc, "split_pattern", counted)
    sliced = key_data._pair_tasks(files, "/a/", "/b/")
    assert isinstance(sliced, PairColumns) and list(sliced) == list(whole)
    assert seen and max(seen) <= 4  # never the whole column at once
    assert sliced[7].path_a == "/a/tensors/key_data/rank=1/steps=0-0.call=0.npys"
    assert (sliced[7].record_a.offset, sliced[7].record_b.offset) == (1152 * 7, 1152 * 2)


def test_a_comparison_s_database_is_bounded_and_spills_into_its_own_folder(tmp_path):
    con = duckdb.connect()
    sql_runner.bound_memory(con)
    limit, folder = con.execute("SELECT current_setting('memory_limit'), current_setting('temp_directory')").fetchall()[0]
    assert limit == "488.2 MiB"  # MEMORY_LIMIT, 512 MB, as DuckDB shows it
    assert sql_runner.MEMORY_LIMIT == "512MB" and "rlprobe-duckdb-" in folder
    sql_runner.bound_memory(con)  # once bounded, left as it is
    assert con.execute("SELECT current_setting('temp_directory')").fetchall()[0][0] == folder


def test_a_bounded_query_that_needs_more_gets_a_raised_bound():
    con = duckdb.connect()
    sql_runner.bound_memory(con, limit="32MB")
    con.execute("SET threads = 1")
    sql = "SELECT list(i ORDER BY i DESC) AS l FROM range(1000000) r(i)"  # one list, needing ~128 MB: no spill
    table = sql_runner.query(con, sql)
    assert len(table["l"][0]) == 1_000_000
    limit = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    assert limit in ("61.0 MiB", "122.0 MiB", "244.0 MiB")  # doubled until it ran


def test_an_unbounded_database_s_error_is_not_retried():
    con = duckdb.connect()
    con.execute("SET memory_limit = '16MB'")
    con.execute("SET threads = 1")
    with pytest.raises(duckdb.OutOfMemoryException):
        sql_runner.query(con, "SELECT list(i ORDER BY i DESC) AS l FROM range(1000000) r(i)")
    assert con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] == "15.2 MiB"


def test_a_capped_key_sheet_copies_only_the_rows_it_shows(monkeypatch):
    n = 50
    table = pa.table({"key": ["a"] * n + ["b"] * 3, "step": list(range(n)) + [0, 1, 2],
                      "status": ["match"] * 40 + ["mismatch"] * 10 + ["match"] * 3,
                      "is_first_divergence": [False] * 40 + [True] + [False] * 12})
    picked_from: list[tuple[list[str], int]] = []
    pick = xlsx._pick_rows

    def recorded(rows, marks, cap):
        picked_from.append((rows.column_names, rows.num_rows))
        return pick(rows, marks, cap)

    monkeypatch.setattr(xlsx, "_pick_rows", recorded)
    groups = xlsx._split_by_key(table, ["b"], cap=5)
    assert list(groups) == ["b", "a"]
    shown, rows = groups["a"]
    assert rows == n and shown["step"].to_pylist() == [40, 41, 42, 43, 44]  # the first divergence, then differing
    assert groups["b"][0].num_rows == groups["b"][1] == 3
    # the rows to show are picked from the columns that decide them; only those rows are then copied whole
    assert picked_from == [(["status", "is_first_divergence"], n), (["status", "is_first_divergence"], 3)]


def test_key_data_files_are_rendered_into_files_not_memory(tmp_path):
    files = KeyDataFiles()
    files.start(pa.table({"key": ["x"] * 3, "step": [0, 1, 2]}))
    files._thread.join()
    assert all(hasattr(f, "fileno") for f in files._files.values())
    files.write(tmp_path)
    assert (tmp_path / "key_data.csv").read_bytes() == b"key,step\r\n x,0\r\nx,1\r\nx,2\r\n".replace(b" ", b"")
    assert all(f.closed for f in files._files.values())


def test_compare_bounds_the_database_it_opens_and_leaves_a_caller_s_as_it_was(tmp_path):
    import numpy as np

    import rlprobe
    from rlprobe.comparison.options import CompareOptions, Runtime
    from rlprobe.comparison.run import compare_dumps
    from rlprobe.lake.reader import open_dump

    for name in ("a", "b"):
        with rlprobe.Probe(tmp_path / name) as p:
            p.save({"log_prob": np.arange(8, dtype=np.float32)})
            p.step()
    dump_a, dump_b = open_dump(tmp_path / "a"), open_dump(tmp_path / "b")
    setting = "SELECT current_setting('temp_directory'), current_setting('memory_limit')"
    opened = duckdb.connect()
    compare_dumps(dump_a, dump_b, CompareOptions(workers=1), Runtime(connect=lambda: opened))
    assert "rlprobe-duckdb-" in opened.execute(setting).fetchall()[0][0]  # rlprobe's own: bounded
    callers = duckdb.connect()
    before = callers.execute(setting).fetchall()[0]
    compare_dumps(open_dump(tmp_path / "a"), open_dump(tmp_path / "b"), CompareOptions(workers=1), Runtime(con=callers))
    assert callers.execute(setting).fetchall()[0] == before  # the caller's settings are the caller's
