"""A clean run whose rollout engine and trainer differ by float32 rounding only (another kernel, another
batch shape: a few ulps) passes `rlprobe check` and compare's single-run rules on any CPU; a difference
beyond rounding still fails. Built with rlprobe.Probe, so no test depends on this CPU's kernels."""

from __future__ import annotations

import numpy as np
import openpyxl
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.checks import token_batch
from rlprobe.cli import main
from rlprobe.comparison.single_run import single_run_findings

RULED = ("on_policy", "rollout_vs_recompute", "kl_first_step")

STEPS, MICRO, SHAPE = 3, 2, (4, 16)


def ulps(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    """x moved by n[i] float32 ulps (n < 0: toward -inf)."""
    out = x.copy()
    for _ in range(int(np.abs(n).max(initial=0))):
        step = np.abs(n) > 0
        out = np.where(step, np.nextafter(out, np.where(n > 0, np.float32(np.inf), np.float32(-np.inf))), out)
        n = n - np.sign(n)
    return out.astype(np.float32)


def rounding_run(path, rollout_shift: float = 0.0, on_policy_shift: float = 0.0, ref_shift: float = 0.0):
    """A PPO-shaped dump whose reference starts as the actor (declared in its config), log-probs down to -12
    (a 32k vocabulary's): rollout_log_prob is old_log_prob with a quarter of its tokens moved by ±1 or 2 ulps
    (the median |Δ| is 0), log_prob at the on-policy micro-batch old_log_prob with some tokens 1 ulp off,
    ref_log_prob at the first step old_log_prob with some tokens ±1 or 2 ulps off and kl = old − ref (up to
    1.9e-6, beyond the old fixed 1e-6); `rollout_shift`, `on_policy_shift`, `ref_shift`: a difference beyond
    rounding added to those."""
    rng = np.random.default_rng(5)
    with rlprobe.Probe(path, flush_interval=0) as probe:
        probe.save_config({"ppo": {"clip": 0.2, "ref_starts_as_actor": True}})
        for step in range(STEPS):
            for micro in range(MICRO):
                old = (-rng.random(SHAPE, dtype=np.float32) * 12).astype(np.float32)
                moved = np.where(rng.random(SHAPE) < 0.25, rng.choice([-2, -1, 1, 2], SHAPE), 0)
                rollout = ulps(old, moved) + np.float32(rollout_shift)
                log_prob = ulps(old, np.where(rng.random(SHAPE) < 0.3, 1, 0))
                if micro == 0:
                    log_prob = log_prob + np.float32(on_policy_shift)
                else:  # after the first update: not on-policy, not compared
                    log_prob = log_prob + np.float32(0.05) * rng.standard_normal(SHAPE).astype(np.float32)
                ref = ulps(old, np.where(rng.random(SHAPE) < 0.3, rng.choice([-2, 2], SHAPE), 0))
                ref = ref + np.float32(ref_shift) if step == 0 else ref - np.float32(0.01)
                probe.save({"rollout_log_prob": rollout, "old_log_prob": old, "log_prob": log_prob,
                            "ref_log_prob": ref, "kl": old - ref})
            probe.step()
    return path


def statuses(result) -> dict[str, str]:
    return {r["check"]: r["status"] for r in result.results.to_pylist()}


@pytest.mark.parametrize("batched", [True, False])
def test_a_median_of_exact_zeros_is_0_in_every_output(tmp_path, monkeypatch, batched):
    """Bin 0 of the |Δ| histogram holds the exact zeros: its quantile is 0, not the bin's upper edge 1.8367e-40
    (a denormal summary.md printed for a clean PPO run's median)."""
    if not batched:
        monkeypatch.setattr(token_batch, "SMALL", -1)  # every key through reduce_pair and PairFigures
    dump, out = rounding_run(tmp_path / "d"), tmp_path / "out"
    r = CliRunner().invoke(main, ["check", str(dump), "-o", str(out), "--no-plots"])
    assert r.exit_code == 0, r.output
    steps = [s for s in pq.read_table(out / "token_steps.parquet").to_pylist() if s["pair"] == "rollout_vs_old"]
    assert [s["step"] for s in steps] == [0, 1, 2]
    d = rlprobe.open(dump)
    for s in steps:
        delta = np.concatenate([d.tensor("rollout_log_prob", s["step"], micro_step=m).astype(np.float64)
                                - d.tensor("old_log_prob", s["step"], micro_step=m) for m in range(MICRO)], None)
        assert np.median(np.abs(delta)) == 0 and np.abs(delta).max() > 0  # what the test is about
        assert s["p50_abs"] == 0.0 and s["max_abs"] == np.abs(delta).max()
        assert 0 < s["p99_abs"] <= s["max_abs"]
    md = (out / "summary.md").read_text()
    header = next(line for line in md.splitlines() if "p50_abs" in line).split("|")
    rows = [line.split("|") for line in md.splitlines() if line.startswith("| rollout_vs_old |")]
    assert len(rows) == 3 and {row[header.index(" p50_abs ")].strip() for row in rows} == {"0"}
    assert "e-40" not in md
    book = openpyxl.load_workbook(out / "report.xlsx", read_only=True)
    sheet = list(book["Rollout vs trainer"].iter_rows(values_only=True))
    column = next(row for row in sheet if "p50_abs" in row).index("p50_abs")
    assert [row[column] for row in sheet if row and row[0] == "rollout_vs_old"] == [0, 0, 0]


def test_rounding_only_passes_every_check_and_the_single_run_rules(tmp_path):
    dump = rounding_run(tmp_path / "d")
    d = rlprobe.open(dump)
    kl = max(float(np.abs(d.tensor("kl", 0, micro_step=m)).max()) for m in range(MICRO))
    assert 1e-6 < kl < 2e-6  # 2 ulps of a log-prob in [-16, -8): what a fixed 1e-6 failed
    result = rlprobe.check(dump)
    assert result.exit_code == 0 and {statuses(result)[c] for c in RULED} == {"pass"}, statuses(result)
    steps = result.tables["token_steps"].to_pylist()
    assert {r["pair"] for r in steps} == {"rollout_vs_old", "on_policy"}
    tolerance = 16 * np.finfo(np.float32).eps * 12
    assert all(0 < r["max_abs"] <= tolerance for r in steps)  # not bitwise: within rounding
    # compare's single-run rules: the engine agrees with its trainer, the on-policy rows are rounding only
    found = single_run_findings({"A": d}, {"A": {"rollout_log_prob", "old_log_prob", "log_prob"}})
    assert found.rollout == {} and 0 < found.rollout_max_abs["A"] <= tolerance
    assert [(r["step"], r["within_tolerance"]) for r in found.on_policy["A"]] == [(0, True), (1, True), (2, True)]
    # the tolerances are parameters: at 0 ulps rounding is a difference again
    strict = rlprobe.check(dump, on_policy_ulps=0, kl_first_step_ulps=0)
    assert statuses(strict)["on_policy"] == "fail" and statuses(strict)["kl_first_step"] == "fail"
    assert strict.rows["kl_first_step"].to_pylist()[0]["tolerance"] == 1e-6


@pytest.mark.parametrize("shift, check", [({"rollout_shift": 1e-2}, "rollout_vs_recompute"),
                                          ({"on_policy_shift": 1e-3}, "on_policy"),
                                          ({"ref_shift": 1e-3}, "kl_first_step")])
def test_a_difference_beyond_rounding_still_fails(tmp_path, shift, check):
    dump = rounding_run(tmp_path / "d", **shift)
    result = rlprobe.check(dump)
    assert {c: s for c, s in statuses(result).items() if c in RULED and s != "pass"} == {check: "fail"}
    rows = result.rows[check].to_pylist()
    assert {r["step"] for r in rows} == ({0} if check == "kl_first_step" else {0, 1, 2})
    found = single_run_findings({"A": rlprobe.open(dump)}, {"A": {"rollout_log_prob", "old_log_prob", "log_prob"}})
    if check == "rollout_vs_recompute":
        assert [r["step"] for r in found.rollout["A"]] == [0, 1, 2] and found.rollout_max_abs["A"] > 9e-3
    if check == "on_policy":
        assert {r["within_tolerance"] for r in found.on_policy["A"]} == {False}
        assert all(r["max_abs_diff"] == pytest.approx(1e-3, rel=1e-2) for r in found.on_policy["A"])


@pytest.mark.parametrize("kl, status", [(5e-6, "pass"), (1e-4, "fail")])
def test_a_kl_without_log_probs_in_its_batch_takes_the_rounding_of_its_ranks(tmp_path, kl, status):
    """The KL's tolerance comes from the log-probs of its batch (the same micro-step and index), else of its
    rank's first step: 16 eps x 12 = 2.3e-5 for log-probs down to -12, where a kl alone had 16 eps x 1 = 1.9e-6.
    Here the log-probs are saved once, the kl for two micro-batches."""
    old = -np.linspace(0.5, 12, 24, dtype=np.float32).reshape(4, 6)
    with rlprobe.Probe(tmp_path / "d", flush_interval=0) as probe:
        probe.save_config({"ref_starts_as_actor": True})
        probe.save({"old_log_prob": old, "ref_log_prob": ulps(old, np.full(old.shape, 2)), "kl": np.zeros((4, 6))})
        probe.save({"kl": np.full((4, 6), kl, np.float32)})
        probe.step()
    result = rlprobe.check(tmp_path / "d")
    assert statuses(result)["kl_first_step"] == status
    if status == "fail":
        assert [(r["micro_step"], r["tolerance"]) for r in result.rows["kl_first_step"].to_pylist()] == \
            [(1, pytest.approx(16 * np.finfo(np.float32).eps * 12))]
    strict = rlprobe.check(tmp_path / "d", kl_first_step_ulps=1)  # 1 eps x 12 = 1.4e-6
    assert statuses(strict)["kl_first_step"] == "fail"
