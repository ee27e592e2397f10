"""`rlprobe sql --run name=path`: several dumps and result directories in one query."""

from __future__ import annotations

import json


def test_two_dumps_as_schemas_and_stacked(dumps, cli):
    q = ("SELECT a.step, a.micro_step, a.mean AS mean_a, b.mean AS mean_b FROM a.key_data a "
         "JOIN b.key_data b USING (key, step, rank, micro_step, \"index\") "
         "WHERE a.key = 'log_prob' AND a.mean <> b.mean ORDER BY ALL")
    result = cli("sql", "--run", f"a={dumps['a']}", "--run", f"b={dumps['b']}", q, "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["step"], r["micro_step"]) for r in rows] == [(2, 0), (2, 1)]
    stacked = cli("sql", "--run", f"a={dumps['a']}", "--run", f"b={dumps['b']}",
                  "SELECT run, count(*) AS n, avg(value) FILTER (WHERE name = 'e2e_tps') AS tps "
                  "FROM all_scalars GROUP BY run ORDER BY run", "--format", "json")
    assert json.loads(stacked.output) == [{"run": "a", "n": 9, "tps": 100.0}, {"run": "b", "n": 9, "tps": 90.0}]


def test_result_directories_as_tables(tmp_path, dumps, cli):
    for name, b in (("same", dumps["same"]), ("diff", dumps["b"])):
        assert cli("compare", dumps["a"], b, "-o", tmp_path / name, "--quiet").exit_code == 0
    result = cli("sql", "--run", f"same={tmp_path / 'same'}", "--run", f"diff={tmp_path / 'diff'}",
                 "SELECT run, count(*) FILTER (WHERE status = 'mismatch') AS mismatches FROM all_key_data "
                 "GROUP BY run ORDER BY run", "--format", "json")
    assert json.loads(result.output) == [{"run": "diff", "mismatches": 2}, {"run": "same", "mismatches": 0}]


def test_dump_positional_plus_runs_and_errors(tmp_path, dumps, cli):
    result = cli("sql", dumps["a"], "--run", f"b={dumps['b']}",
                 "SELECT (SELECT count(*) FROM key_data) AS main_rows, (SELECT count(*) FROM b.key_data) AS b_rows",
                 "--format", "json")
    assert json.loads(result.output) == [{"main_rows": 12, "b_rows": 12}]
    assert cli("sql", "--run", "1bad=x", "select 1").exit_code == 2
    assert cli("sql", "--run", "a", "select 1").exit_code == 2
    missing = cli("sql", "--run", f"a={tmp_path / 'nope'}", "select 1")
    assert missing.exit_code == 3 and "does not exist" in missing.output
    assert cli("sql", "select 1").exit_code == 2  # a query alone: usage
