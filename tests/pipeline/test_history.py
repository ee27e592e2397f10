"""Pipeline history: appended atomically, visible to queries, shown and plotted by `rlprobe history`."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq


def _spec(tmp_path: Path, a: Path, b: Path) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(f"""version: 1
name: hist
runs:
  base: {a}
  cand: {b}
output: ./out
history: ./history.parquet
queries:
  - {{name: earlier_runs, sql: "select count(distinct run_id) as runs from history"}}
gates:
  - {{name: tps, sql: sql/gates/tps_regression.sql}}
""", encoding="utf-8")
    return path


def test_history_appends_one_run_per_pipeline_run(tmp_path, dumps, cli):
    spec = _spec(tmp_path, dumps["a"], dumps["b"])
    assert cli("pipeline", "run", spec).exit_code == 1
    history = pq.read_table(tmp_path / "history.parquet").to_pylist()
    metrics = {(r["metric"], r["key"]): r for r in history}
    assert metrics[("first_divergence_step", None)]["value"] == 2.0
    assert metrics[("first_divergence_step", None)]["text"] == "log_prob"
    assert metrics[("max_rel_err", "log_prob")]["value"] > 0 and metrics[("max_rel_err", "responses")]["value"] == 0
    assert metrics[("gate_passed", "tps")]["value"] == 0.0
    assert metrics[("scalar_mean_a", "e2e_tps")]["value"] == 100.0
    assert metrics[("scalar_mean_b", "e2e_tps")]["value"] == 90.0
    assert cli("pipeline", "run", spec, "--set", f"runs.cand={dumps['same']}").exit_code == 0
    history = pq.read_table(tmp_path / "history.parquet")
    assert len(set(history.column("run_id").to_pylist())) == 2
    # the second run's query saw the first run in the history table
    assert pq.read_table(tmp_path / "out" / "queries" / "earlier_runs.parquet").to_pylist() == [{"runs": 1}]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".history")]


def test_history_command_table_and_plots(tmp_path, dumps, cli):
    spec = _spec(tmp_path, dumps["a"], dumps["b"])
    cli("pipeline", "run", spec)
    cli("pipeline", "run", spec, "--set", f"runs.cand={dumps['same']}")
    result = cli("history", tmp_path / "history.parquet", "--plots", tmp_path / "plots")
    assert result.exit_code == 0, result.output
    # the title keeps the path and the count whole on one line, however long the temporary path
    assert f"{tmp_path / 'history.parquet'} (2 runs)" in result.output.splitlines()
    assert "0/1" in result.output and "1/1" in result.output
    pngs = {p.name for p in (tmp_path / "plots").iterdir()}
    assert {"history_first_divergence_step.png", "history_max_rel_err.png", "history_gate_passed.png"} <= pngs
    assert all((tmp_path / "plots" / p).stat().st_size > 1000 for p in pngs)


def test_unreadable_history_exit_3(tmp_path, dumps, cli):
    (tmp_path / "history.parquet").write_bytes(b"not parquet")
    result = cli("pipeline", "run", _spec(tmp_path, dumps["a"], dumps["b"]))
    assert result.exit_code == 3 and "history" in result.output and not (tmp_path / "out").exists()
    assert cli("history", tmp_path / "history.parquet").exit_code == 3
    assert cli("history", tmp_path / "missing.parquet").exit_code == 3
