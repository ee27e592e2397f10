"""`rlprobe info OUT` and `rlprobe sql OUT QUERY` on what `rlprobe compare A B -o OUT` writes."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _dump(path, log_prob_shift):
    with rlprobe.Probe(path) as p:
        for step in range(2):
            p.save({"responses": np.arange(12, dtype=np.int64).reshape(3, 4),
                    "log_prob": np.full((3, 4), -1.5 - step + (log_prob_shift if step == 1 else 0), np.float32)})
            p.log_metrics({"e2e_tps": 70.0 + step})
            p.step()
    return path


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    root = tmp_path_factory.mktemp("result_dir")
    a, b, out = _dump(root / "a", 0.0), _dump(root / "b", 0.25), root / "out"
    result = run("compare", a, b, "-o", out, "--quiet")
    assert result.exit_code == 0, result.output
    return a, b, out


def test_info_json_on_a_comparison_names_the_runs_the_divergence_and_the_tables(comparison):
    a, b, out = comparison
    result = run("info", out, "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["kind"] == "comparison" and info["pipeline"] is None
    assert info["runs"] == {"a": {"path": str(a), "format": "rlprobe"}, "b": {"path": str(b), "format": "rlprobe"}}
    first = info["first_divergence"]
    assert (first["key"], first["step"], first["status"]) == ("log_prob", 1, "mismatch")
    assert info["counts"] == {"match": 3, "mismatch": 1}  # responses at steps 0, 1 and log_prob at step 0 match
    assert info["tables"] == [{"table": "key_data", "file": "key_data.parquet", "rows": 4}]
    assert pq.read_metadata(out / "key_data.parquet").num_rows == 4


def test_info_table_on_a_comparison(comparison):
    _, _, out = comparison
    result = run("info", out)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "comparison (rlprobe compare)" in text
    assert "first divergence: log_prob at step 1, rank 0, micro_step 0: mismatch" in text
    assert "counts: match 3, mismatch 1" in text
    assert "key_data" in text and "key_data.parquet" in text


def test_sql_on_a_comparison_reads_the_tables_run_reads(comparison):
    _, _, out = comparison
    query = "SELECT key, step, status FROM {}key_data WHERE status <> 'match' ORDER BY ALL"
    alone = run("sql", out, query.format(""), "--format", "json")
    assert alone.exit_code == 0, alone.output
    assert json.loads(alone.output) == [{"key": "log_prob", "step": 1, "status": "mismatch"}]
    as_run = run("sql", "--run", f"x={out}", query.format("x."), "--format", "json")
    assert json.loads(as_run.output) == json.loads(alone.output)
    both = run("sql", out, "--run", f"x={out}", "SELECT count(*) AS n FROM key_data JOIN x.key_data USING (key, step)",
               "--format", "json")
    assert both.exit_code == 0, both.output
    assert json.loads(both.output) == [{"n": 4}]


def test_a_folder_that_is_neither_a_dump_nor_a_comparison_is_refused(comparison, tmp_path):
    (tmp_path / "summary.json").write_text("{}")  # a summary without key_data.parquet is no comparison
    for args in (("info", tmp_path), ("sql", tmp_path, "SELECT 1")):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 3, result.output
        assert "is not a dump" in result.output


def test_info_names_a_corrupt_table_of_a_comparison(comparison, tmp_path):
    _, _, out = comparison
    broken = tmp_path / "out"
    broken.mkdir()
    for name in ("summary.json", "key_data.parquet"):
        (broken / name).write_bytes((out / name).read_bytes())
    (broken / "grads.parquet").write_bytes(b"not parquet")
    result = CliRunner().invoke(main, ["info", str(broken)])
    assert result.exit_code == 3 and "grads.parquet" in result.output


def test_info_and_sql_on_a_pipeline_output_show_its_gates_and_query_tables(comparison, tmp_path):
    a, b, _ = comparison
    spec = tmp_path / "p.yaml"
    spec.write_text(f"""version: 1
name: tiny
runs:
  a: {a}
  b: {b}
output: {tmp_path / "out"}
queries: [sql/first_divergence.sql]
gates:
  - {{name: log_prob_same, sql: "select step from key_data where key = 'log_prob' and status <> 'match'"}}
report: {{xlsx: false, csv: false, markdown: true, junit: false, plots: false}}
""")
    assert run("pipeline", "run", spec).exit_code == 1  # the gate fails: log_prob differs at step 1
    info = json.loads(run("info", tmp_path / "out", "--json").output)
    assert info["pipeline"] == "tiny" and info["gates"] == [{"name": "log_prob_same", "passed": False, "rows": 1}]
    tables = {t["table"]: t["rows"] for t in info["tables"]}
    assert tables["gates_log_prob_same"] == 1 and tables["queries_first_divergence"] == 1 and tables["key_data"] == 4
    text = " ".join(run("info", tmp_path / "out").output.split())
    assert "comparison (pipeline tiny)" in text and "gate log_prob_same: FAIL (1 rows)" in text
    rows = run("sql", tmp_path / "out", "SELECT step FROM gates_log_prob_same", "--format", "json")
    assert json.loads(rows.output) == [{"step": 1}]
