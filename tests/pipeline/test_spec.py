"""Pipeline YAML validation: every error names the file, the line and the field."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from rlprobe.lake.sql_runner import resource_dir
from rlprobe.pipeline.spec import SpecError, load_pipeline

GOOD = """version: 1
name: demo
runs: {{baseline: {a}, candidate: {b}}}
output: ./out/${{name}}
"""


def _good(tmp_path: Path, dumps, extra: str = "") -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(GOOD.format(a=dumps["a"], b=dumps["b"]) + extra, encoding="utf-8")
    return path


def _error(path, *overrides, **kw) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_pipeline(path, list(overrides), **kw)
    return info.value


def test_valid_pipeline_resolves_paths_relative_to_the_file(tmp_path, dumps):
    p = load_pipeline(_good(tmp_path, dumps))
    assert list(p.runs) == ["baseline", "candidate"]
    assert p.output == tmp_path / "out" / "demo"
    assert p.spec.executor.kind == "local" and p.spec.report.junit is True


def test_malformed_yaml_names_file_and_line(tmp_path, write_yaml):
    path = write_yaml(tmp_path / "bad.yaml", "version: 1\nname: x\nruns: {a: ./a, b: ./b\noutput: ./o\n")
    e = _error(path)
    assert e.exit_code == 2 and f"{path}:4: malformed YAML" in str(e)


def test_duplicate_keys_name_both_lines(tmp_path, dumps, write_yaml, cli):
    # YAML loaders keep the last of two equal keys: the first gate list would vanish unseen
    path = _good(tmp_path, dumps, "gates:\n  - {name: g1, sql: 'select 1'}\nreport: {csv: false}\n"
                                  "gates:\n  - {name: g2, sql: 'select 2'}\n")
    e = _error(path)
    assert e.exit_code == 2 and str(e) == f"{path}:8: key 'gates' appears twice (lines 5 and 8); keep one"
    result = cli("pipeline", "run", path)
    assert result.exit_code == 2 and "key 'gates' appears twice (lines 5 and 8)" in result.output
    assert not (tmp_path / "out").exists()
    nested = write_yaml(tmp_path / "n.yaml", f"version: 1\nname: x\nruns:\n  a: {dumps['a']}\n  a: {dumps['b']}\n"
                                             "output: o\n")
    assert "n.yaml:5: key 'runs.a' appears twice (lines 4 and 5)" in str(_error(nested))
    flow = write_yaml(tmp_path / "f.yaml", GOOD.format(a=dumps["a"], b=dumps["b"]) + "report: {csv: true, csv: false}\n")
    assert "f.yaml:5: key 'report.csv' appears twice (lines 5 and 5)" in str(_error(flow))
    # a key given beside a merge key (<<) overrides the merged one: not a duplicate
    merged = load_pipeline(_good(tmp_path, dumps, "select: {<<: {steps: '0-1', ranks: '0'}, steps: '0-2'}\n"))
    assert (merged.spec.select.steps, merged.spec.select.ranks) == ("0-2", "0")


def test_unknown_field_suggests_the_right_one(tmp_path, dumps):
    e = _error(_good(tmp_path, dumps, "selct: {steps: 0-3}\nreport: {junt: true}\n"))
    text = str(e)
    assert f"{tmp_path / 'p.yaml'}:5: selct: unknown field 'selct'; did you mean 'select'?" in text
    assert f"p.yaml:6: report.junt: unknown field 'junt'; did you mean 'junit'?" in text
    assert e.exit_code == 2


def test_wrong_type_names_line_and_field(tmp_path, dumps):
    e = _error(_good(tmp_path, dumps, "executor:\n  kind: local\n  workers: two\n"))
    assert "p.yaml:7: executor.workers: Input should be a valid integer" in str(e) and "'two'" in str(e)
    e = _error(_good(tmp_path, dumps, "executor: {kind: spark}\n"))
    assert "p.yaml:5: executor.kind:" in str(e) and "'local' or 'ray'" in str(e)
    e = _error(_good(tmp_path, dumps, "select: {steps: 3-1}\n"))
    assert "p.yaml:5: select.steps:" in str(e) and "range like 4-6" in str(e)


def test_missing_required_field_and_gate_key(tmp_path, dumps, write_yaml):
    e = _error(_good(tmp_path, dumps, "gates:\n  - {name: g, sqll: 'select 1'}\n"))
    assert "p.yaml:6: gates[0].sql: required field 'sql' is missing" in str(e)
    assert "gates[0].sqll: unknown field 'sqll'; did you mean 'sql'?" in str(e)
    path = write_yaml(tmp_path / "noname.yaml", f"version: 1\nruns: {{a: {tmp_path}, b: {tmp_path}}}\noutput: o\n")
    assert "required field 'name' is missing" in str(_error(path, check_runs=False))


def test_exactly_two_runs(tmp_path, dumps, write_yaml):
    path = write_yaml(tmp_path / "p.yaml", f"version: 1\nname: x\nruns: {{a: {dumps['a']}}}\noutput: o\n")
    assert "p.yaml:3: runs: give exactly two runs" in str(_error(path))


def test_missing_run_directory_gives_the_path_and_exit_3(tmp_path, dumps, write_yaml, cli):
    path = write_yaml(tmp_path / "p.yaml", f"version: 1\nname: x\nruns:\n  a: {dumps['a']}\n  b: ./nope\noutput: o\n")
    e = _error(path)
    assert e.exit_code == 3 and "p.yaml:5: runs.b:" in str(e) and str(tmp_path / "nope") in str(e)
    result = cli("pipeline", "validate", path)
    assert result.exit_code == 3 and "nope" in result.output


def test_env_expansion_name_and_date(tmp_path, dumps, write_yaml):
    path = write_yaml(tmp_path / "p.yaml", "version: 1\nname: nightly\nruns:\n  a: ${A_RUN}\n  b: ${B_RUN}\n"
                      "output: ${OUT_ROOT}/${name}/${date}\n")
    env = {"A_RUN": str(dumps["a"]), "B_RUN": str(dumps["b"]), "OUT_ROOT": str(tmp_path / "o")}
    p = load_pipeline(path, env=env, today=dt.date(2025, 1, 31))
    assert p.runs["a"] == dumps["a"] and p.output == tmp_path / "o" / "nightly" / "2025-01-31"
    e = _error(path, env={"A_RUN": "x"})
    assert "p.yaml:5: runs.b: environment variable ${B_RUN} is not set" in str(e)


def test_set_overrides_are_typed_and_validated(tmp_path, dumps):
    path = _good(tmp_path, dumps)
    p = load_pipeline(path, ["executor.workers=4", f"runs.candidate={dumps['same']}", "report.plots=true",
                             "select.steps=0-1"])
    assert p.spec.executor.workers == 4 and p.runs["candidate"] == dumps["same"]
    assert p.spec.report.plots is True and p.spec.select.step_list() == [0, 1]
    e = _error(path, "executor.workers=many")
    assert "(--set executor.workers): executor.workers: Input should be a valid integer" in str(e)
    e = _error(path, "select.stepz=1")
    assert "did you mean 'steps'?" in str(e)
    assert "expected FIELD.PATH=VALUE" in str(_error(path, "workers"))


def test_sql_files_beside_the_yaml_then_bundled(tmp_path, dumps):
    (tmp_path / "mine.sql").write_text("SELECT 1 AS one")
    p = load_pipeline(_good(tmp_path, dumps, "queries: [mine.sql, sql/first_divergence.sql]\n"
                            "gates:\n  - {name: tps, sql: sql/gates/tps_regression.sql}\n"))
    assert [q.name for q in p.queries] == ["mine", "first_divergence"]
    assert p.queries[0].sql == "SELECT 1 AS one"
    assert p.gates[0].origin == str(resource_dir("sql") / "gates" / "tps_regression.sql")
    e = _error(_good(tmp_path, dumps, "queries: [sql/first_divergnce.sql]\n"))
    assert "p.yaml:5: queries[0]: SQL file 'sql/first_divergnce.sql' not found" in str(e)
    assert "did you mean 'sql/first_divergence.sql'?" in str(e)


def test_query_names_may_not_shadow_tables(tmp_path, dumps):
    e = _error(_good(tmp_path, dumps, "queries: [{name: key_data, sql: 'select 1'}]\n"))
    assert "p.yaml:5: queries[0]: 'key_data' is a table the pipeline provides" in str(e)
    e = _error(_good(tmp_path, dumps, "gates:\n  - {name: g, sql: 'select 1'}\n  - {name: g, sql: 'select 2'}\n"))
    assert "p.yaml:7: gates[1].name: 'g' is already used" in str(e)


def test_validate_command_ok_and_error_exit_codes(tmp_path, dumps, write_yaml, cli):
    ok = cli("pipeline", "validate", _good(tmp_path, dumps))
    assert ok.exit_code == 0 and "ok" in ok.output and "demo" in ok.output
    bad = write_yaml(tmp_path / "bad.yaml", "version: 2\n")
    result = cli("pipeline", "validate", bad)
    assert result.exit_code == 2 and "bad.yaml:1: version: Input should be 1" in result.output


@pytest.mark.parametrize("name", ["compare.yaml", "nightly.yaml", "grads.yaml", "modules.yaml"])
def test_shipped_pipelines_validate(name, dumps, tmp_path):
    env = {"RUN_A": str(dumps["a"]), "RUN_B": str(dumps["b"]), "BASELINE": str(dumps["a"]),
           "CANDIDATE": str(dumps["b"]), "RLPROBE_OUT": str(tmp_path)}
    p = load_pipeline(resource_dir("pipelines") / name, env=env)
    assert p.output.is_relative_to(tmp_path)


@pytest.mark.parametrize("name", ["check.yaml", "compare.yaml", "nightly.yaml", "grads.yaml", "modules.yaml"])
def test_shipped_pipelines_pass_the_validate_command(name, dumps, tmp_path, cli, monkeypatch):
    """`rlprobe pipeline validate pipelines/check.yaml` (one run, checked alone) ended in a traceback."""
    for var, dump in (("RUN", "a"), ("RUN_A", "a"), ("RUN_B", "b"), ("BASELINE", "a"), ("CANDIDATE", "b")):
        monkeypatch.setenv(var, str(dumps[dump]))
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path))
    result = cli("pipeline", "validate", resource_dir("pipelines") / name)
    assert result.exit_code == 0 and result.output.startswith("ok: "), result.output
    assert ("(checked alone)" in result.output) == (name == "check.yaml")


@pytest.mark.parametrize("params, said", [("{eps: .nan}", "check parameter eps=nan: expected a number >= 0"),
                                           ("{group_size: 0}", "check parameter group_size=0: expected a whole"),
                                           ("{nope: 1}", "unknown check parameter(s) ['nope']")])
def test_check_params_are_checked_by_validate_with_their_line(tmp_path, dumps, cli, params, said):
    """They were taken as written until the check ran (NaN: no token outside eps, every threshold passed)."""
    spec = _good(tmp_path, dumps, f"check:\n  params: {params}\n")
    result = cli("pipeline", "validate", spec)
    line = GOOD.count("\n") + 2
    assert result.exit_code == 2 and f"p.yaml:{line}: check.params: {said}" in result.output, result.output


def test_set_paths_are_relative_to_the_current_folder_file_paths_to_the_file(tmp_path, dumps, write_yaml,
                                                                              monkeypatch):
    """A path typed on the command line means what the shell means; one in the YAML is beside it."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "work").mkdir()
    path = write_yaml(tmp_path / "conf" / "p.yaml", f"version: 1\nname: x\nruns:\n  a: {dumps['a']}\n"
                      "  b: ./b_in_yaml\noutput: out\n")
    monkeypatch.chdir(tmp_path / "work")
    (tmp_path / "work" / "here").symlink_to(dumps["b"])
    p = load_pipeline(path, ["runs.b=here", "output=reports"])
    assert p.runs["b"] == tmp_path / "work" / "here" and p.output == tmp_path / "work" / "reports"
    p = load_pipeline(path, check_runs=False)
    assert p.runs["b"] == tmp_path / "conf" / "b_in_yaml" and p.output == tmp_path / "conf" / "out"
    e = _error(path, "runs.b=./missing")
    assert e.exit_code == 3 and f"relative to {tmp_path / 'work'}" in str(e) and "(--set runs.b)" in str(e)
