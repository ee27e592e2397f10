"""`rlprobe pipeline run`: queries, gates, exit codes, JUnit, Markdown, atomic output."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlprobe.lake.sql_runner import resource_dir


def _spec(tmp_path: Path, a: Path, b: Path, extra: str = "", output: str = "./out") -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(f"version: 1\nname: t\nruns:\n  base: {a}\n  cand: {b}\noutput: {output}\n{extra}", encoding="utf-8")
    return path


GATES = """gates:
  - {name: responses_identical, sql: "select * from key_data where key = 'responses' and status <> 'match'"}
  - {name: tps, sql: sql/gates/tps_regression.sql, description: e2e_tps at most 5% lower}
"""


def test_identical_runs_pass_every_gate(tmp_path, dumps, cli):
    result = cli("pipeline", "run", _spec(tmp_path, dumps["a"], dumps["same"], GATES + "queries: [sql/first_divergence.sql]\n"))
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_divergence"] is None
    assert summary["gates"][0] == {"name": "responses_identical", "passed": True, "rows": 0, "description": "",
                                   "sql": summary["gates"][0]["sql"]}
    assert pq.read_table(out / "queries" / "first_divergence.parquet").num_rows == 0
    assert {"key_data.parquet", "report.xlsx", "key_data.csv", "summary.md", "junit.xml"} <= {p.name for p in out.iterdir()}


def test_failing_gate_exit_1_with_rows_in_reports(tmp_path, dumps, cli):
    result = cli("pipeline", "run", _spec(tmp_path, dumps["a"], dumps["b"], GATES))
    assert result.exit_code == 1, result.output
    assert "gate tps: FAIL (1 rows)" in result.output and "gate responses_identical: pass" in result.output
    out = tmp_path / "out"
    gates = {g["name"]: g for g in json.loads((out / "summary.json").read_text())["gates"]}
    assert gates["tps"]["passed"] is False and gates["tps"]["rows"] == 1
    rows = pq.read_table(out / "gates" / "tps.parquet").to_pylist()
    assert rows[0]["mean_a"] == 100.0 and rows[0]["mean_b"] == 90.0
    assert rows[0]["change"] == pytest.approx(-0.1) and rows[0]["allowed_change"] == pytest.approx(-0.05)
    suite = ET.parse(out / "junit.xml").getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["responses_identical"].find("failure") is None
    failure = cases["tps"].find("failure")
    assert "1 row(s)" in failure.get("message") and "mean_b=90.0" in failure.text
    md = (out / "summary.md").read_text()
    assert "1 of 2 gates failed" in md and "### Gate `tps` failed: 1 row(s)" in md and "| name |" in md


def test_params_change_the_bundled_gate_threshold(tmp_path, dumps, cli):
    result = cli("pipeline", "run", _spec(tmp_path, dumps["a"], dumps["b"], GATES), "--set", "params.tps_max_drop=0.2")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("params, said", [("{timing_max_rise: .nan}", "timing_max_rise: nan is not a number"),
                                           ("{tps_max_drop: abc}", "tps_max_drop: 'abc' is not a number"),
                                           ("{tps_max_drop: true}", "tps_max_drop: True is not a number"),
                                           ("{tps_metric: 3}", "tps_metric: 3 is not a text")])
def test_a_bundled_gate_parameter_of_another_type_is_refused_by_validate(tmp_path, dumps, cli, params, said):
    """NaN as timing_max_rise passed the timing gate whatever the timings (every comparison with NaN is false);
    a text or true as a threshold failed in DuckDB's binder, at run time, with its candidate list."""
    spec = _spec(tmp_path, dumps["a"], dumps["b"], GATES + f"params: {params}\n")
    for command in ("validate", "run"):
        result = cli("pipeline", command, spec)
        assert result.exit_code == 2 and f"p.yaml:{len(GATES.splitlines()) + 7}: params: parameter {said}" in \
            result.output, result.output
    assert not (tmp_path / "out").exists()
    assert cli("pipeline", "validate", _spec(tmp_path, dumps["a"], dumps["b"], "params: {my_own: .nan}\n")).exit_code == 0


def test_tables_visible_to_queries(tmp_path, dumps, cli):
    extra = """queries:
  - name: tables
    sql: >
      select (select count(*) from key_data) as key_data, (select count(*) from scalars) as scalars,
             (select count(*) from stats_a) as stats_a, (select count(*) from stats_b) as stats_b,
             (select count(*) from grads) as grads, (select count(*) from grad_steps) as grad_steps,
             (select count(*) from modules) as modules, (select count(*) from history) as history,
             (select tps_max_drop from params) as tps_max_drop
  - name: loss
    sql: "select step, value_a, value_b, rel_change from scalars where name = 'loss' order by step"
"""
    assert cli("pipeline", "run", _spec(tmp_path, dumps["a"], dumps["b"], extra)).exit_code == 0
    counts = pq.read_table(tmp_path / "out" / "queries" / "tables.parquet").to_pylist()[0]
    assert counts == {"key_data": 12, "scalars": 9, "stats_a": 12, "stats_b": 12, "grads": 0, "grad_steps": 0,
                      "modules": 0, "history": 0, "tps_max_drop": 0.05}
    loss = pq.read_table(tmp_path / "out" / "queries" / "loss.parquet").to_pylist()
    assert loss == [{"step": s, "value_a": 1.0 + s, "value_b": 1.0 + s, "rel_change": 0.0} for s in range(3)]


def test_failing_query_exit_2_names_the_file_and_duckdb_message(tmp_path, dumps, cli):
    (tmp_path / "broken.sql").write_text("SELECT nope FROM key_data")
    result = cli("pipeline", "run", _spec(tmp_path, dumps["a"], dumps["b"], "queries: [broken.sql]\n"))
    assert result.exit_code == 2
    assert str(tmp_path / "broken.sql") in result.output and "nope" in result.output
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no temp dir left behind


def test_gate_on_missing_table_exit_2(tmp_path, dumps, cli):
    result = cli("pipeline", "run", _spec(tmp_path, dumps["a"], dumps["b"],
                                          "gates:\n  - {name: g, sql: 'select * from no_such_table'}\n"))
    assert result.exit_code == 2 and "gate g" in result.output and "no_such_table" in result.output


def test_run_that_is_not_a_dump_exit_3(tmp_path, dumps, cli):
    (tmp_path / "empty").mkdir()
    result = cli("pipeline", "run", _spec(tmp_path, dumps["a"], tmp_path / "empty"))
    assert result.exit_code == 3 and "is not a dump" in result.output
    result = cli("pipeline", "run", _spec(tmp_path, dumps["a"], tmp_path / "gone"))
    assert result.exit_code == 3 and str(tmp_path / "gone") in result.output


def test_unwritable_output_exit_3(tmp_path, dumps, cli):
    (tmp_path / "afile").write_text("x")
    result = cli("pipeline", "run", _spec(tmp_path, dumps["a"], dumps["b"], output="./afile/out"))
    assert result.exit_code == 3 and "cannot be written" in result.output
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    result = cli("pipeline", "run", _spec(tmp_path, dumps["a"], dumps["b"], output="./busy"))
    assert result.exit_code == 3 and "holds other files" in result.output
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_rerun_replaces_output_and_failure_keeps_the_old_one(tmp_path, dumps, cli):
    spec = _spec(tmp_path, dumps["a"], dumps["b"])
    assert cli("pipeline", "run", spec).exit_code == 0
    first = json.loads((tmp_path / "out" / "summary.json").read_text())
    (tmp_path / "broken.sql").write_text("SELEC 1")
    result = cli("pipeline", "run", spec, "--set", "queries=[broken.sql]")
    assert result.exit_code == 2 and "broken.sql" in result.output
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == first
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_dry_run_writes_nothing(tmp_path, dumps, cli):
    result = cli("pipeline", "run", _spec(tmp_path, dumps["a"], dumps["b"], GATES), "--dry-run")
    assert result.exit_code == 0 and "gate tps" in result.output and "dry run" in result.output
    assert not (tmp_path / "out").exists()


def test_shipped_compare_and_nightly_run(tmp_path, dumps, cli, monkeypatch):
    monkeypatch.setenv("RUN_A", str(dumps["a"]))
    monkeypatch.setenv("RUN_B", str(dumps["b"]))
    monkeypatch.setenv("BASELINE", str(dumps["a"]))
    monkeypatch.setenv("CANDIDATE", str(dumps["b"]))
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path))
    result = cli("pipeline", "run", resource_dir("pipelines") / "compare.yaml")
    assert result.exit_code == 1 and "gate key_data_agree: FAIL (2 rows)" in result.output
    assert (tmp_path / "compare" / "plots" / "key_data_heatmap.png").stat().st_size > 0
    result = cli("pipeline", "run", resource_dir("pipelines") / "nightly.yaml")
    assert result.exit_code == 1, result.output
    assert "gate e2e_tps_regression: FAIL" in result.output and "gate loss_drift: pass" in result.output
    assert "gate responses_identical: pass" in result.output and "gate timing_regression: pass" in result.output
    assert pq.read_table(tmp_path / "nightly" / "history.parquet").num_rows > 0
    monkeypatch.setenv("CANDIDATE", str(dumps["same"]))
    assert cli("pipeline", "run", resource_dir("pipelines") / "nightly.yaml").exit_code == 0


# a pipeline run paused until killed: while comparing, or between setting the earlier output aside
# and moving the new one in
_PAUSED = """
import pathlib, sys, time
from rlprobe.pipeline.runner import run_pipeline
from rlprobe.pipeline.spec import load_pipeline

spec, mark, where = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]

def pause(*_):
    mark.write_text("paused")
    time.sleep(600)

pipeline = load_pipeline(spec)
if where == "publish":
    rename = pathlib.Path.rename

    def rename_after_a_pause(self, target):
        if pathlib.Path(target) == pipeline.output:
            pause()
        return rename(self, target)

    pathlib.Path.rename = rename_after_a_pause
if where == "write":  # while the output is written into its work folder
    import rlprobe.report.comparison_files as files

    files.write_summary_json = pause
run_pipeline(pipeline)
"""


def _killed_while(spec: Path, where: str) -> None:
    import subprocess
    import sys

    mark = spec.parent / f"paused-{where}"
    proc = subprocess.Popen([sys.executable, "-c", _PAUSED, str(spec), str(mark), where])
    try:
        while not mark.exists():  # as long as the process takes; fails only if it ended first
            try:
                code = proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"the pipeline exited with {code} before pausing {where}")
    finally:
        proc.kill()
        proc.wait()


def test_next_run_removes_what_killed_runs_left_and_restores_the_set_aside_output(tmp_path, dumps, cli):
    spec = _spec(tmp_path, dumps["a"], dumps["b"])
    assert cli("pipeline", "run", spec).exit_code == 0
    first = (tmp_path / "out" / "summary.json").read_bytes()
    def left() -> set[str]:
        return {p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")}

    _killed_while(spec, "write")
    first_left = left()
    assert len(first_left) == 2  # its work folder and lock
    _killed_while(spec, "publish")  # the run that started removed them, then was killed itself
    assert not left() & first_left and len(left()) == 3 and any(n.endswith(".old") for n in left())
    assert not (tmp_path / "out").exists()  # killed before the new output moved in
    # the next run, even one that stops at a broken query, puts the earlier output back first
    (tmp_path / "broken.sql").write_text("SELEC 1")
    result = cli("pipeline", "run", spec, "--set", "queries=[broken.sql]")
    assert result.exit_code == 2 and "broken.sql" in result.output
    assert (tmp_path / "out" / "summary.json").read_bytes() == first
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_full_disk_is_exit_3_and_keeps_the_earlier_output(tmp_path, dumps, mounts):
    import os
    import subprocess
    import sys

    disk = tmp_path / "disk"
    mounted = mounts(disk, "size=1m")
    if not mounted:
        disk.mkdir()
    spec = _spec(tmp_path, dumps["a"], dumps["same"], output=str(disk / "out"))

    def run(fsize: int | None = None) -> subprocess.CompletedProcess:
        def set_limit() -> None:
            if fsize is not None:
                import resource

                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

        return subprocess.run([sys.executable, "-m", "rlprobe.cli", "pipeline", "run", str(spec), "--quiet"],
                              capture_output=True, text=True, preexec_fn=set_limit)

    assert run().returncode == 0
    out = disk / "out"
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    if mounted:
        # leave room for the files written before report.xlsx and one page more: the disk fills up
        # while the workbook is written (a tmpfs counts whole pages)
        page = os.statvfs(disk).f_frsize
        pages = sum(-(-(out / n).stat().st_size // page) for n in
                    ("key_data.parquet", "scalars.parquet", "summary.json", "key_data.csv")) + 1
        assert (out / "report.xlsx").stat().st_size > 2 * page
        free = os.statvfs(disk).f_bavail * page
        with open(disk / "filler", "wb") as f:
            f.write(b"\0" * (free - pages * page))
    spec.write_text(spec.read_text().replace(str(dumps["same"]), str(dumps["b"])))
    result = run(None if mounted else 4096)  # else files may not grow past 4 KiB (RLIMIT_FSIZE)
    message = "".join(result.stderr.split())  # compared without spaces: wrapped at any width, paths too
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr
    assert "".join(f"error: output {out} cannot be written: ".split()) in message, result.stderr
    assert ("Nospaceleftondevice" if mounted else "Filetoolarge") in message, result.stderr
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert {p.name for p in disk.iterdir()} == ({"out", "filler"} if mounted else {"out"})
