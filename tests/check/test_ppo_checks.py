"""`rlprobe check` on the PPO example: a clean run passes, a rollout engine in bf16 and one whose
weights are never re-synced fail rollout_vs_recompute with figures recomputed here in numpy."""

from __future__ import annotations

import math

import numpy as np
import openpyxl
import pytest
from click.testing import CliRunner

import rlprobe
import rlprobe.checks
from rlprobe.cli import main


def statuses(result) -> dict[str, str]:
    return {r["check"]: r["status"] for r in result.results.to_pylist()}


def deltas(dump_path, step: int) -> np.ndarray:
    """Every token's rollout − trainer log-prob of one step (both micro-batches), in float64."""
    d = rlprobe.open(dump_path)
    return np.concatenate([
        d.tensor("rollout_log_prob", step, micro_step=m).astype(np.float64)
        - d.tensor("old_log_prob", step, micro_step=m).astype(np.float64) for m in (0, 1)], axis=None)


def test_a_clean_run_passes_every_check(ppo_runs):
    result = rlprobe.check(ppo_runs.get(None))
    assert result.exit_code == 0
    got = statuses(result)
    assert got.pop("grpo_advantages") == "not_applicable"  # PPO: no groups
    assert set(got.values()) == {"pass"}, got
    steps = result.tables["token_steps"].to_pylist()
    assert {r["pair"] for r in steps} == {"rollout_vs_old", "on_policy"}
    # the same fp32 weights, but the engine and the trainer run other batch shapes, so the CPU's kernels may
    # round them apart (4.77e-07 on an AVX-512 EPYC): agreement is within float32 rounding, not bitwise
    d = rlprobe.open(ppo_runs.get(None))
    for r in (r for r in steps if r["pair"] == "rollout_vs_old"):
        delta = deltas(ppo_runs.get(None), r["step"])
        old = np.concatenate([d.tensor("old_log_prob", r["step"], micro_step=m) for m in (0, 1)], axis=None)
        assert r["tokens"] == delta.size and r["max_abs"] == np.abs(delta).max()
        assert r["max_abs"] <= 16 * np.finfo(np.float32).eps * max(1.0, np.abs(old).max())


@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_rollout_bf16_is_reported_with_figures_numpy_recomputes(ppo_runs, q, tmp_path):
    dump = ppo_runs.get("rollout-bf16")
    result = rlprobe.check(dump, out=tmp_path / "out")
    assert result.exit_code == 1 and statuses(result)["rollout_vs_recompute"] == "fail"
    rows = result.rows["rollout_vs_recompute"].to_pylist()
    assert [r["step"] for r in rows] == [0, 1, 2]  # every step: bf16 from the start
    for row in rows:
        d = deltas(dump, row["step"])
        assert row["tokens"] == d.size
        assert row["mean_abs"] == pytest.approx(np.abs(d).mean(), rel=1e-9)
        assert row["mean_delta"] == pytest.approx(d.mean(), rel=1e-9, abs=1e-15)
        assert row["sd_delta"] == pytest.approx(d.std(), rel=1e-6)
        assert row["max_abs"] == pytest.approx(np.abs(d).max(), rel=1e-12)
        assert row["outside_share"] == np.mean((np.exp(d) < 0.8) | (np.exp(d) > 1.2))  # eps: config ppo.clip
        name = f"p{round(q * 100)}_abs"
        exact = np.quantile(np.abs(d), q, method="inverted_cdf")
        assert exact <= row[name] * (1 + 1e-6) and row[name] <= exact * (1 + 1 / 64) + 1e-12  # within one bin
        assert row["mean_abs"] > 1e-3  # bf16 rounding of a tiny model's logits
    sequences = result.tables["token_sequences"]
    seq = [r for r in sequences.to_pylist() if r["pair"] == "rollout_vs_old" and r["step"] == 1
           and r["micro_step"] == 1]
    d = rlprobe.open(dump).tensor("rollout_log_prob", 1, micro_step=1).astype(np.float64) - \
        rlprobe.open(dump).tensor("old_log_prob", 1, micro_step=1).astype(np.float64)
    assert [r["log_ratio"] for r in seq] == pytest.approx(d.sum(axis=1).tolist(), rel=1e-9, abs=1e-12)
    assert (tmp_path / "out" / "plots" / "rollout_vs_old_delta_hist.png").is_file()


def test_stale_rollout_weights_fail_from_step_1_only(ppo_runs):
    dump = ppo_runs.get("stale-rollout-weights")
    result = rlprobe.check(dump)
    rows = result.rows["rollout_vs_recompute"].to_pylist()
    assert [r["step"] for r in rows] == [1, 2]  # step 0 samples from the weights it trains
    for row in rows:
        d = deltas(dump, row["step"])
        assert row["mean_abs"] == pytest.approx(np.abs(d).mean(), rel=1e-9)
        assert row["max_abs"] == pytest.approx(np.abs(d).max(), rel=1e-12)
    first = next(r for r in result.results.to_pylist() if r["check"] == "rollout_vs_recompute")["first"]
    assert first.startswith("pair=rollout_vs_old, step=1, rank=0")
    assert statuses(result)["on_policy"] == "pass"  # the trainer itself is on-policy


def test_the_cli_writes_the_reports_and_exits_1(ppo_runs, tmp_path):
    out = tmp_path / "check"
    r = CliRunner().invoke(main, ["check", str(ppo_runs.get("rollout-bf16")), "-o", str(out)])
    assert r.exit_code == 1, r.output
    assert "fail            rollout_vs_recompute (3 rows): pair=rollout_vs_old, step=0" in r.output
    for name in ("check.parquet", "summary.json", "summary.md", "report.xlsx", "token_steps.parquet",
                 "rows/rollout_vs_recompute.parquet"):
        assert (out / name).is_file(), name
    book = openpyxl.load_workbook(out / "report.xlsx", read_only=True)
    assert book.sheetnames[0] == "Summary" and "rollout_vs_recompute" in book.sheetnames
    cells = [row for row in book["Summary"].iter_rows(values_only=True)]
    assert ("rollout_vs_recompute", "fail", "fail", 3) == cells[3 + 3][:4]
    assert "FAILED: rollout_vs_recompute" in (out / "summary.md").read_text()
    assert (out / ".rlprobe-output.json").is_file()  # published by the one output writer (docs/architecture.md)
    assert [p.name for p in tmp_path.iterdir()] == ["check"]  # its work folder beside OUT is gone


def test_the_cli_refuses_an_output_folder_of_other_files(ppo_runs, tmp_path):
    out = tmp_path / "check"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = CliRunner().invoke(main, ["check", str(ppo_runs.get(None)), "-o", str(out)])
    assert r.exit_code == 3 and "holds other files" in r.output
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    r = CliRunner().invoke(main, ["check", str(ppo_runs.get(None)), "-o", str(tmp_path / "fresh")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["check", str(ppo_runs.get("rollout-bf16")), "-o", str(tmp_path / "fresh")])
    assert r.exit_code == 1 and "FAILED" in (tmp_path / "fresh" / "summary.md").read_text()  # its own: replaced


def test_a_parameter_changes_the_verdict(ppo_runs):
    result = rlprobe.check(ppo_runs.get("rollout-bf16"), max_mean_abs_delta=1.0, max_abs_delta=1.0)
    assert statuses(result)["rollout_vs_recompute"] == "pass" and result.exit_code == 0
    with pytest.raises(ValueError, match="unknown check parameter"):
        rlprobe.check(ppo_runs.get(None), max_mean_abs=1.0)
    r = CliRunner().invoke(main, ["check", str(ppo_runs.get(None)), "--param", "nope=1"])
    assert r.exit_code == 2 and "unknown check parameter" in r.output


@pytest.mark.parametrize("param, expected", [
    ("eps=NaN", "a number >= 0"), ("eps=-1", "a number >= 0"), ("max_mean_abs_delta=nan", "a number >= 0"),
    ("on_policy_ulps=x", "a number >= 0"), ("group_size=0", "a whole number >= 1"),
    ("group_size=2.5", "a whole number >= 1"), ("workers=-1", "a whole number >= 1"),
    ("generation_every=0", "a whole number >= 1"), ("ref_starts_as_actor=maybe", "true or false")])
def test_a_parameter_out_of_its_domain_is_a_usage_error(ppo_runs, param, expected, tmp_path):
    """NaN passed every threshold (eps=NaN: no token outside), a negative eps was 'math domain error', a text
    threshold a DuckDB traceback, group_size=0 or workers=-1 were taken: each is exit 2 naming it now."""
    r = CliRunner().invoke(main, ["check", str(ppo_runs.get("rollout-bf16")), "-o", str(tmp_path / "o"),
                                  "--param", param])
    name = param.partition("=")[0]
    assert r.exit_code == 2 and f"check parameter {name}=" in r.output and expected in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_infinity_is_no_limit(ppo_runs):
    result = rlprobe.check(ppo_runs.get("rollout-bf16"), max_mean_abs_delta=float("inf"), max_abs_delta=float("inf"),
                           max_outside_share=float("inf"))
    assert statuses(result)["rollout_vs_recompute"] == "pass"


def test_kl_at_the_first_step_fails_when_the_reference_is_bf16(ppo_runs):
    """The example's config declares ref_starts_as_actor: a bf16 reference gives KL != 0 at step 0."""
    result = rlprobe.check(ppo_runs.get("ref-bf16"))
    assert statuses(result)["kl_first_step"] == "fail"
    rows = result.rows["kl_first_step"].to_pylist()
    assert {r["step"] for r in rows} == {0} and rows[0]["reference_start"] == "declared"
    kl = rlprobe.open(ppo_runs.get("ref-bf16")).tensor("kl", 0, micro_step=0)
    assert rows[0]["max"] == pytest.approx(float(kl.max()))
    assert not math.isclose(float(np.abs(kl).max()), 0.0)
