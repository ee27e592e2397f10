"""The pipeline `check:` stage: one run checked alone, two runs compared and each checked."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rlprobe.cli import main
from rlprobe.lake.sql_runner import resource_dir


def test_a_one_run_pipeline_checks_it(ppo_runs, tmp_path, monkeypatch):
    monkeypatch.setenv("RUN", str(ppo_runs.get("stale-rollout-weights")))
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path))
    r = CliRunner().invoke(main, ["pipeline", "run", str(resource_dir("pipelines") / "check.yaml"), "--quiet"])
    assert r.exit_code == 1, r.output
    summary = json.loads((tmp_path / "check" / "summary.json").read_text())
    assert summary["check"]["run"]["failed"] == ["rollout_vs_recompute"]
    assert (tmp_path / "check" / "check" / "run" / "report.xlsx").is_file()


def test_a_two_run_pipeline_compares_and_checks_each(ppo_runs, tmp_path):
    spec = tmp_path / "p.yaml"
    spec.write_text(f"version: 1\nname: both\nruns: {{a: {ppo_runs.get(None)}, b: {ppo_runs.get('rollout-bf16')}}}\n"
                    f"output: {tmp_path / 'out'}\ncheck: {{plots: false}}\n"
                    "report: {xlsx: false, csv: false, markdown: true, junit: false}\n")
    r = CliRunner().invoke(main, ["pipeline", "run", str(spec), "--quiet"])
    assert r.exit_code == 1, r.output  # no gate; the check of b failed
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["check"]["a"]["failed"] == [] and summary["check"]["b"]["failed"] == ["rollout_vs_recompute"]
    assert (tmp_path / "out" / "check" / "b" / "summary.md").is_file()
    assert (tmp_path / "out" / "key_data.parquet").is_file()  # the comparison ran too
