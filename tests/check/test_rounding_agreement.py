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
from rlprobe.check import token_batch
from rlprobe.cli import main

STEPS, MICRO, SHAPE = 3, 2, (4, 16)


def ulps(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    """x moved by n[i] float32 ulps (n < 0: toward -inf)."""
    out = x.copy()
    for _ in range(int(np.abs(n).max(initial=0))):
        step = np.abs(n) > 0
        out = np.where(step, np.nextafter(out, np.where(n > 0, np.float32(np.inf), np.float32(-np.inf))), out)
        n = n - np.sign(n)
    return out.astype(np.float32)


def rounding_run(path, rollout_shift: float = 0.0, on_policy_shift: float = 0.0):
    """A PPO-shaped dump: rollout_log_prob is old_log_prob with a quarter of its tokens moved by ±1 or 2 ulps
    (the median |Δ| is 0), log_prob at the on-policy micro-batch old_log_prob with some tokens 1 ulp off;
    `rollout_shift`, `on_policy_shift`: a difference beyond rounding added to those."""
    rng = np.random.default_rng(5)
    with rlprobe.Probe(path, flush_interval=0) as probe:
        for _ in range(STEPS):
            for micro in range(MICRO):
                old = (-rng.random(SHAPE, dtype=np.float32) * 6).astype(np.float32)
                moved = np.where(rng.random(SHAPE) < 0.25, rng.choice([-2, -1, 1, 2], SHAPE), 0)
                rollout = ulps(old, moved) + np.float32(rollout_shift)
                log_prob = ulps(old, np.where(rng.random(SHAPE) < 0.3, 1, 0))
                if micro == 0:
                    log_prob = log_prob + np.float32(on_policy_shift)
                else:  # after the first update: not on-policy, not compared
                    log_prob = log_prob + np.float32(0.05) * rng.standard_normal(SHAPE).astype(np.float32)
                probe.save({"rollout_log_prob": rollout, "old_log_prob": old, "log_prob": log_prob})
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
