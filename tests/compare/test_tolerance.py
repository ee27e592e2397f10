"""Tolerances (rlprobe/comparison/tolerance.py, docs/across-devices.md "Tolerances"): which pairs are close, by
which tolerance, and how the command, rlprobe.compare() and pipelines set it."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main
from rlprobe.comparison.options import CompareOptions
from rlprobe.comparison.tolerance import COARSER, EPS, FAMILIES, Tolerance, default_rtol
from rlprobe.lake.sql_runner import sql_text


def _dump(path, values, stats_only=False):
    with rlprobe.Probe(path, stats_only=stats_only) as probe:
        probe.save(values)
        probe.step()
    return path


def _rows(out):
    return {r["key"]: r for r in pq.read_table(out / "key_data.parquet").to_pylist()}


def _ulp_apart(x):
    """x one float32 ulp away everywhere: rounding, whatever the magnitude of each element."""
    return np.nextafter(x, np.float32(np.inf))


def test_defaults_per_dtype():
    assert default_rtol("float32") == 128 * 2.0**-23 and default_rtol("float64") == 128 * 2.0**-52
    assert default_rtol("bfloat16") == 4 * 2.0**-7 and default_rtol("float16") == 4 * 2.0**-10
    assert default_rtol("float8_e4m3fn") == 0.5 and default_rtol("float8_e5m2") == 1.0
    assert default_rtol("int64") == default_rtol("bool") == 0.0
    r = Tolerance().resolve("advantages", "advantages", "float32")
    assert (r.rtol, r.atol, r.source) == (2.0**-16, 2.0**-20, "float32 default")  # atol: rtol x a scale of 1/16
    assert Tolerance().resolve("kl", "kl", "float32").atol == 2.0**-16  # log-probs' floor: 1
    assert Tolerance(rtol=1.0).resolve("prompts", "prompts", "float32").rtol == 0.0  # tokens: exact
    assert Tolerance(rtol=1.0).resolve("x", "x", "int64").source == "exact (int64)"


def test_overrides_key_over_family_over_global_and_stats_rtol_alias():
    t = Tolerance.of({"rtol": 1e-3, "families": {"log_probs": {"rtol": 1e-4}},
                      "keys": {"old_log_probs": {"atol": 0.5}}, "stats_rtol": 0.0})
    g = t.resolve("advantages", "advantages", "float32")
    assert (g.rtol, g.atol) == (1e-3, 1e-3 / 16)
    lp = t.resolve("ref_log_prob", "ref_log_prob", "float32")
    assert (lp.rtol, lp.atol, lp.source) == (1e-4, 1e-4, "family log_probs")
    saved = t.resolve("old_log_probs", "old_log_prob", "float32")  # a trainer's name, by its saved name
    assert (saved.rtol, saved.atol, saved.source) == (1e-4, 0.5, "key old_log_probs")
    assert (lp.stats_rtol, lp.stats_atol) == (0.0, 0.0)  # --stats-rtol 0: statistics-only rows exact
    with pytest.raises(ValueError, match=r"tolerance.families: unknown family logprobs; the families are tokens"):
        Tolerance.of({"families": {"logprobs": {"rtol": 1}}})
    with pytest.raises(ValueError, match=r"tolerance.keys.kl.rtol must be a finite number >= 0, not nan"):
        Tolerance.of({"keys": {"kl": {"rtol": float("nan")}}})


def test_the_sql_macros_hold_tolerance_py_numbers():
    text = sql_text("pair_macros.sql")
    macro = text[text.index("MACRO coarser_rounding"):text.index("MACRO tolerance_text")]
    assert COARSER == ("float16", "bfloat16")
    assert f"{EPS['float16']} / 8" in macro and f"4 * {EPS['bfloat16']}" in macro
    assert default_rtol("bfloat16") == 4 * EPS["bfloat16"]
    assert set(FAMILIES) == {"tokens", "log_probs", "rewards_advantages", "losses", "values"}


def test_near_zero_elements_do_not_make_rounding_a_divergence(tmp_path):
    x = np.concatenate([np.linspace(-4, 4, 999, dtype=np.float32), [1e-30]]).astype(np.float32)
    tokens = np.arange(8)
    a = _dump(tmp_path / "a", {"old_log_prob": x, "responses": tokens, "advantages": x})
    # errors of one ulp of the largest element everywhere, as a sum's rounding gives them (near zero too)
    noisy = (x.astype(np.float64) + 4 * 2.0**-23 * np.where(np.arange(x.size) % 2, 1, -1)).astype(np.float32)
    b = _dump(tmp_path / "b", {"old_log_prob": noisy, "responses": tokens + (np.arange(8) == 7),
                               "advantages": x * np.float32(1 + 1e-3)})
    summary = rlprobe.compare(a, b, tmp_path / "out")
    rows = _rows(tmp_path / "out")
    lp = rows["old_log_prob"]
    assert lp["max_rel_err"] > 0.5  # element-wise: the near-zero elements' own relative error is large
    assert lp["status"] == "close" and lp["norm_rel_err"] < 2 * 2.0**-23 and "within rounding" in lp["message"]
    assert rows["responses"]["status"] == "mismatch"  # tokens: exact
    assert rows["advantages"]["status"] == "mismatch" and rows["advantages"]["norm_rel_err"] == pytest.approx(1e-3, 0.01)
    first = summary["first_divergence"]
    assert first["key"] == "responses" and summary["first_difference"]["key"] == "responses"
    assert {k["key"]: k["close"] for k in summary["keys"]} == {"responses": 0, "old_log_prob": 1, "advantages": 0}


def test_bfloat16_rounding_in_a_float32_key_is_named_as_a_coarser_dtype(tmp_path):
    import torch

    x = np.linspace(-9, -0.1, 512, dtype=np.float32)
    rounded = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    a = _dump(tmp_path / "a", {"ref_log_prob": x})
    b = _dump(tmp_path / "b", {"ref_log_prob": rounded})
    summary = rlprobe.compare(a, b, tmp_path / "out")
    message = summary["first_divergence"]["message"]
    assert summary["first_divergence"]["status"] == "mismatch"
    assert re.search(r"errors of half-precision rounding \(max\|a-b\|/max\|a\| [0-9.]+e-0[34];", message), message
    assert "coarser dtype (bfloat16 or float16) than float32" in message
    # a key judged by a tolerance of its own (rlprobe.compare(tolerance=...)) takes the same pair as close
    summary = rlprobe.compare(a, b, tmp_path / "own", tolerance={"keys": {"ref_log_prob": {"rtol": 8e-3}}})
    assert summary["first_divergence"] is None and summary["first_difference"]["tolerance_source"] == "key ref_log_prob"


def test_statistics_only_rows_take_the_rule_and_the_command_line_sets_it(tmp_path):
    x = np.linspace(0.5, 2, 64, dtype=np.float32)
    a = _dump(tmp_path / "a", {"values": x}, stats_only=True)
    b = _dump(tmp_path / "b", {"values": _ulp_apart(x)}, stats_only=True)
    runner = CliRunner()
    result = runner.invoke(main, ["compare", str(a), str(b), "-o", str(tmp_path / "o"), "--quiet", "--fail-on-diff"])
    assert result.exit_code == 0, result.output
    assert "1 stats_only_close" in result.output and "no divergence beyond rounding" in result.output
    assert _rows(tmp_path / "o")["values"]["status"] == "stats_only_close"
    for flag in ("--stats-rtol", "--rtol"):  # --stats-rtol: the statistics-only rows' alias of --rtol
        result = runner.invoke(main, ["compare", str(a), str(b), "-o", str(tmp_path / "p"), "--quiet",
                                      "--fail-on-diff", flag, "0", "--atol", "0"])
        assert result.exit_code == 1 and "stats_only_mismatch" in result.output, (flag, result.output)
    result = runner.invoke(main, ["compare", str(a), str(b), "-o", str(tmp_path / "q"), "--atol", "nan"])
    assert result.exit_code == 2 and "not a tolerance" in result.output


def test_options_object_and_its_errors(tmp_path):
    options = CompareOptions.build(keys="log_prob,kl", steps="0-2", tolerance=1e-3, atol=0.0)
    assert options.keys == ["log_prob", "kl"] and options.steps == [0, 1, 2]
    assert (options.tolerance.rtol, options.tolerance.atol) == (1e-3, 0.0)
    with pytest.raises(rlprobe.ProbeError, match="tolerance: unknown field.* rtols"):
        CompareOptions.build(tolerance={"rtols": 1})
    with pytest.raises(rlprobe.ProbeError, match="workers must be a whole number"):
        CompareOptions(workers=0)


def test_pipeline_tolerance_and_the_bitwise_gate(tmp_path):
    from rlprobe.pipeline.runner import run_pipeline
    from rlprobe.pipeline.spec import SpecError, load_pipeline

    x = np.linspace(1, 2, 32, dtype=np.float32)
    a = _dump(tmp_path / "a", {"kl": x})
    b = _dump(tmp_path / "b", {"kl": _ulp_apart(x)})
    spec = tmp_path / "p.yaml"

    def write(tolerance: str, params: str = "{}") -> None:
        spec.write_text(f"""version: 1
name: tol
runs: {{a: {a}, b: {b}}}
output: {tmp_path / 'out'}
compare:
  key_data: {{tolerance: {tolerance}}}
gates:
  - {{name: agree, sql: sql/gates/key_data_diverged.sql}}
params: {params}
report: {{xlsx: false, csv: false, markdown: false}}
""")

    write("{}")
    result = run_pipeline(load_pipeline(spec))
    assert [g.passed for g in result.gates] == [True] and result.summary["counts"] == {"close": 1}
    write("{}", "{bitwise: true}")
    assert [g.passed for g in run_pipeline(load_pipeline(spec)).gates] == [False]
    write("{families: {log_probs: {rtol: 0, atol: 0}}}")  # kl is a log-prob family key
    result = run_pipeline(load_pipeline(spec))
    assert [g.passed for g in result.gates] == [False] and result.summary["counts"] == {"mismatch": 1}
    write("{families: {logprob: {rtol: 0}}}")
    with pytest.raises(SpecError, match="logprob"):
        load_pipeline(spec)
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["first_divergence"]["key"] == "kl"


def test_close_rows_have_their_colour_and_count_in_the_workbook_and_summary_md(tmp_path):
    import openpyxl

    x = np.linspace(1, 2, 32, dtype=np.float32)
    a = _dump(tmp_path / "a", {"kl": x, "loss": np.float32(1.0)})
    b = _dump(tmp_path / "b", {"kl": _ulp_apart(x), "loss": np.float32(1.0)})
    rlprobe.compare(a, b, tmp_path / "out")
    book = openpyxl.load_workbook(tmp_path / "out" / "report.xlsx")
    rows = list(book["kl"].iter_rows(max_row=2))
    assert rows[1][rows[0].index(next(c for c in rows[0] if c.value == "status"))].value == "close"
    assert rows[1][0].fill.fgColor.rgb == "FFDDEBF7"  # close: a fill of its own (workbook.FILLS)
    assert list(book["loss"].iter_rows(max_row=2))[1][0].fill.fill_type is None  # match: none
    summary = [[c.value for c in row] for row in book["Summary"].iter_rows()]
    assert any(r[0] == "close" and r[1] == 1 for r in summary)  # rows per status
    assert any(str(r[1]).startswith("no divergence beyond rounding — first difference, within rounding: 'kl'")
               for r in summary if r[0] == "verdict")
    md = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    assert "| close | 1 |" in md and "| kl | 1 | 1 | 1 | 0 |" in md  # counts; per key: rows, matching, close
