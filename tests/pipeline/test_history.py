"""Pipeline history: appended atomically, visible to queries, shown and plotted by `rlprobe history`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest


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


def _history_spec(tmp_path: Path, a: Path, b: Path, history: Path) -> Path:
    path = tmp_path / "h.yaml"
    path.write_text(f"version: 1\nname: hist\nruns: {{base: '{a}', cand: '{b}'}}\noutput: ./out\n"
                    f"history: '{history}'\n", encoding="utf-8")
    return path


def test_read_only_history_is_refused_before_any_work(tmp_path, dumps, cli, mounts):
    ro = tmp_path / "ro"
    history = (ro if mounts(ro, "ro,size=1m") else Path("/proc/1/rlprobe-cannot-exist")) / "history.parquet"
    result = cli("pipeline", "run", _history_spec(tmp_path, dumps["a"], dumps["b"], history))
    message = "".join(result.output.split())  # compared without spaces: wrapped at any width, paths too
    assert result.exit_code == 3 and f"historyfile{history}cannotbewritten" in message, result.output
    assert "change`history:`" in message
    assert not (tmp_path / "out").exists()  # refused before the comparison, not after publishing it


def test_history_turning_read_only_mid_run_keeps_the_output_and_the_history(tmp_path, dumps, mounts):
    import subprocess

    from rlprobe.pipeline.runner import PipelineError, run_pipeline
    from rlprobe.pipeline.spec import load_pipeline

    folder = tmp_path / "hist"
    mounted = mounts(folder, "size=1m")
    spec = _history_spec(tmp_path, dumps["a"], dumps["b"], folder / "history.parquet")
    assert run_pipeline(load_pipeline(spec)).exit_code == 0
    before = (folder / "history.parquet").read_bytes()

    def turn_read_only(done: int, total: int) -> None:  # while the tensors are compared
        if mounted:
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        else:
            folder.chmod(0o555)

    with pytest.raises(PipelineError) as error:
        run_pipeline(load_pipeline(spec, ["runs.cand=" + str(dumps["same"])]), progress=turn_read_only)
    message = str(error.value)
    assert error.value.exit_code == 3
    assert f"history file {folder / 'history.parquet'} cannot be written: " in message, message
    assert f"the output {tmp_path / 'out'} is complete, but this run is not in the history" in message
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["run_b"] == str(dumps["same"])  # the second run's output was published
    assert (folder / "history.parquet").read_bytes() == before
    assert [p.name for p in folder.iterdir()] == ["history.parquet"]
