"""The two-run verdict reads each run's single-run rules (rlprobe check's on_policy and
rollout_vs_recompute, comparison/single_run.py): a rollout engine that was never re-synced gets its
own verdict, and an epoch after an update is not called a non-deterministic recomputation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner

import rlprobe
import rlprobe.checks
from rlprobe.cli import main


def rollout_max_abs(path) -> float:
    """The largest |rollout_log_prob - old_log_prob| of a PPO example run, recomputed in numpy."""
    d = rlprobe.open(path)
    return max(float(np.abs(d.tensor("rollout_log_prob", s, micro_step=m).astype(np.float64)
                            - d.tensor("old_log_prob", s, micro_step=m)).max()) for s in range(3) for m in (0, 1))


def test_a_stale_rollout_engine_is_named_not_read_as_a_changed_learning_rate(ppo_runs, tmp_path):
    clean, stale = ppo_runs.get(None), ppo_runs.get("stale-rollout-weights")
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["compare", str(clean), str(stale), "-o", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_divergence"]["key"] == "responses" and summary["first_divergence"]["step"] == 1
    # the figure, recomputed here: the largest |rollout - trainer| log-prob of run B at step 1
    d = rlprobe.open(stale)
    worst = max(float(np.abs(d.tensor("rollout_log_prob", 1, micro_step=m).astype(np.float64)
                             - d.tensor("old_log_prob", 1, micro_step=m).astype(np.float64)).max()) for m in (0, 1))
    assert worst > 0.01
    baseline = rollout_max_abs(clean)  # 0, or float32 rounding where this CPU's kernels round them apart
    assert baseline < 1e-5
    assert (f"run B's rollout engine disagrees with its trainer: max |Δ| {worst:.3g} at step 1 (rank 0, "
            f"rollout_log_prob - trainer log-prob), baseline ≤ {baseline:.3g} (run A)") in summary["suspect"]
    assert "learning rate" not in summary["suspect"] + summary["advice"]
    assert "weight sync" in summary["advice"]
    assert set(summary["rollout_vs_trainer"]) == {"B"} and summary["rollout_vs_trainer"]["B"][0]["step"] == 1
    # each trainer recomputes its own log-probs: bitwise, or within float32 rounding on some CPUs
    assert all(r["within_tolerance"] for rows in summary["on_policy_recompute"].values() for r in rows)
    assert "run B's rollout engine disagrees" in " ".join(r.output.split())  # the console says it too
    assert "rollout engine disagrees" in (out / "summary.md").read_text()


def test_the_same_pair_reversed_names_run_a(ppo_runs, tmp_path):
    summary = rlprobe.compare(ppo_runs.get("stale-rollout-weights"), ppo_runs.get(None), tmp_path / "out")
    assert "run A's rollout engine disagrees with its trainer" in summary["suspect"]
    assert f"baseline ≤ {rollout_max_abs(ppo_runs.get(None)):.3g} (run B)" in summary["suspect"]


def test_without_a_rollout_fault_the_key_rule_stands(ppo_runs, tmp_path):
    summary = rlprobe.compare(ppo_runs.get(None), ppo_runs.get("lr"), tmp_path / "out")
    assert "rollout engine" not in summary["suspect"] and summary["rollout_vs_trainer"] == {}


def _ppo_epochs(path: Path, lr: float, noise_at: int | None = None) -> Path:
    """A trainer that passes over each rollout twice (ppo_epochs 2, two micro-batches), one probe step
    per pass, saving the pass index: at the second pass log_prob is after an update, != old_log_prob.
    `noise_at`: a step whose first pass recomputes log_prob with noise beyond float32 rounding."""
    rng = np.random.default_rng(0)
    with rlprobe.Probe(path, flush_interval=0) as probe:
        for step in range(4):
            epoch, rollout = step % 2, step // 2
            for micro in range(2):
                old = -np.random.default_rng(10 * rollout + micro).random((4, 6), dtype=np.float32) * 3
                step_noise = rng.standard_normal(old.shape).astype(np.float32)
                log_prob = old if epoch == 0 else old + np.float32(lr) * step_noise
                if step == noise_at and micro == 0:
                    log_prob = old + np.float32(1e-3)
                probe.save({"log_prob": log_prob, "old_log_prob": old, "ppo_epoch": np.int64(epoch)})
            probe.step()
    return path


def test_the_second_epoch_is_not_called_a_non_deterministic_recomputation(tmp_path):
    a, b = _ppo_epochs(tmp_path / "a", 0.01), _ppo_epochs(tmp_path / "b", 0.03)
    dump = rlprobe.open(b)  # what the old bitwise rule flagged: micro-step 0 of step 1 differs
    assert not np.array_equal(dump.tensor("log_prob", 1, micro_step=0), dump.tensor("old_log_prob", 1, micro_step=0))
    summary = rlprobe.compare(a, b, tmp_path / "out")
    assert summary["first_divergence"]["key"] == "log_prob" and summary["first_divergence"]["step"] == 1
    assert summary["on_policy_recompute"] == {}
    assert "not deterministic" not in summary["suspect"]


def test_a_first_epoch_that_recomputes_otherwise_is_named_with_its_figures(tmp_path):
    a, b = _ppo_epochs(tmp_path / "a", 0.01), _ppo_epochs(tmp_path / "b", 0.01, noise_at=2)
    summary = rlprobe.compare(a, b, tmp_path / "out")
    assert summary["first_divergence"]["key"] == "log_prob" and summary["first_divergence"]["step"] == 2
    rows = summary["on_policy_recompute"]["B"]
    assert [(r["step"], r["rank"]) for r in rows] == [(2, 0)] and "A" not in summary["on_policy_recompute"]
    assert rows[0]["max_abs_diff"] == pytest.approx(1e-3, rel=1e-3)
    assert rows[0]["within_tolerance"] is False and 0 < rows[0]["tolerance"] < 1e-4
    assert ("in run B log_prob differs from old_log_prob where the run is on-policy (step 2, rank 0, max |Δ| 0.001, "
            "> tolerance") in summary["suspect"]
    assert "the actor's recomputation is not deterministic" in summary["suspect"]


def test_a_recomputation_off_by_rounding_only_is_named_when_the_runs_part_there(tmp_path):
    """Bitwise: a first divergence at old_log_prob is explained by a run whose on-policy recomputation
    differs by float32 rounding, which the single-run check itself lets pass."""
    a, b = _ppo_epochs(tmp_path / "a", 0.01), _ppo_epochs(tmp_path / "b", 0.01)
    dump = rlprobe.open(b)
    assert rlprobe.checks.check_dump(b, only=("on_policy",)).results["status"].to_pylist() == ["pass"]
    summary = rlprobe.compare(a, a, tmp_path / "same")
    assert summary["on_policy_recompute"] == {} and summary["first_divergence"] is None
    with rlprobe.Probe(tmp_path / "c", flush_interval=0) as probe:
        for step in range(2):
            old = dump.tensor("old_log_prob", step * 2, micro_step=0)
            probe.save({"log_prob": np.nextafter(old, np.float32(0)), "old_log_prob": old})
            probe.step()
    with rlprobe.Probe(tmp_path / "d", flush_interval=0) as probe:
        for step in range(2):
            old = dump.tensor("old_log_prob", step * 2, micro_step=0)
            probe.save({"log_prob": old, "old_log_prob": np.nextafter(old, np.float32(0))})
            probe.step()
    # by default the runs differ within rounding (one ulp): no divergence, and the advice names run B's recompute
    summary = rlprobe.compare(tmp_path / "d", tmp_path / "c", tmp_path / "default")
    assert summary["first_divergence"] is None and summary["first_difference"]["status"] == "close"
    assert "the actor of run A and of run B recomputes its log-probs on-policy not bit for bit" in summary["advice"]
    summary = rlprobe.compare(tmp_path / "d", tmp_path / "c", tmp_path / "out", rtol=0, atol=0)  # bitwise
    rows = summary["on_policy_recompute"]["B"]
    assert [(r["step"], r["within_tolerance"]) for r in rows] == [(0, True), (1, True)]
    assert ("in run B log_prob differs from old_log_prob where the run is on-policy (step 0, rank 0"
            in summary["suspect"])
    assert "within float32 rounding" in summary["suspect"] and "not deterministic" in summary["suspect"]


def test_the_rules_read_beside_the_pairs_give_the_findings_read_after_them(tmp_path):
    """With workers > 1 the single-run rules run on a thread while the tensor pairs are compared
    (comparison/run.py); with one worker after them: the same summary, finding for finding."""
    a, b = _ppo_epochs(tmp_path / "a", 0.01), _ppo_epochs(tmp_path / "b", 0.01, noise_at=2)
    one = rlprobe.compare(a, b, tmp_path / "one", workers=1)
    two = rlprobe.compare(a, b, tmp_path / "two", workers=2)
    assert two["on_policy_recompute"]["B"] and two["on_policy_recompute"] == one["on_policy_recompute"]
    for field in ("suspect", "advice", "rollout_vs_trainer", "first_divergence", "counts"):
        assert two[field] == one[field], field


def test_a_rule_that_fails_beside_the_pairs_fails_the_comparison(tmp_path, monkeypatch):
    import rlprobe.comparison.run as compare_run

    def broken(*args, **kwargs):
        raise RuntimeError("single-run rule bug")

    monkeypatch.setattr(compare_run, "single_run_findings", broken)
    a = _ppo_epochs(tmp_path / "a", 0.01)
    with pytest.raises(RuntimeError, match="single-run rule bug"):
        rlprobe.compare(a, a, tmp_path / "out", workers=2)
    assert not (tmp_path / "out").exists()


def test_the_single_run_rules_read_no_advantages(ppo_runs):
    """compare's single-run rules (on_policy, rollout_vs_recompute) never read the group_advantages table,
    so check_dump(only=...) does not read every advantages tensor for it; the full check still does."""
    from rlprobe.comparison.single_run import RULES

    root = Path(__file__).resolve().parents[2] / "sql"
    readers = sorted(p.name for p in root.rglob("*.sql") if "group_advantages" in p.read_text(encoding="utf-8"))
    assert readers == ["grpo_advantages.sql"]  # the one check that reads the table (checks/run.py names it)
    dump = rlprobe.open(ppo_runs.get(None))
    full = rlprobe.checks.check_dump(dump, {"group_size": 2})
    assert full.tables["group_advantages"].num_rows > 0
    only = rlprobe.checks.check_dump(dump, {"group_size": 2}, only=RULES)
    assert only.tables["group_advantages"].num_rows == 0
    assert [r["check"] for r in only.results.to_pylist()] == list(RULES)
    assert only.results.to_pylist() == [r for r in full.results.to_pylist() if r["check"] in RULES]
    # and reduce only the token pairs the two rules read (checks/token_rows.py, selection_for): every rollout pair, and
    # of the on_policy pairs those that are not bitwise equal by their hash (the on_policy rule reports no
    # bitwise equal pair whatever its tokens say), here none or those this CPU's kernels round apart
    # (test_token_selection.py builds both kinds)
    steps = full.tables["token_steps"]
    rollout = steps.filter(pc.not_equal(steps["pair"], "on_policy"))
    assert 0 < rollout.num_rows < steps.num_rows
    lean = only.tables["token_steps"]
    assert lean.filter(pc.not_equal(lean["pair"], "on_policy")).equals(rollout)
    every = {(r["step"], r["rank"]): (r["tokens"], r["max_abs"]) for r in steps.to_pylist() if r["pair"] == "on_policy"}
    reduced = {(r["step"], r["rank"]): (r["tokens"], r["max_abs"]) for r in lean.to_pylist()
               if r["pair"] == "on_policy"}
    assert reduced.items() <= every.items()  # the figures the rule reads, equal to the full reduction's
    assert {k for k, (_, largest) in every.items() if largest != 0} <= set(reduced)  # none that differ is left out


def test_the_rules_run_in_a_connection_of_the_callers(ppo_runs):
    """compare hands each run's rules a cursor of its own DuckDB database (check_dump(con=...)) instead of
    starting one a run; the check's tables are registered there and its results are the same."""
    import duckdb

    from rlprobe.checks.run import check_dump
    from rlprobe.comparison.single_run import RULES

    path = ppo_runs.get("stale-rollout-weights")
    database = duckdb.connect()
    database.register("stats", pa.table({"mine": [1]}))  # the caller's own tables stay its own
    cursor = database.cursor()
    given = check_dump(path, {"on_policy_ulps": 0}, only=RULES, con=cursor)
    alone = check_dump(path, {"on_policy_ulps": 0}, only=RULES)
    assert given.results.equals(alone.results) and given.rows["rollout_vs_recompute"].num_rows > 0
    assert given.rows["rollout_vs_recompute"].equals(alone.rows["rollout_vs_recompute"])
    assert cursor.sql("SELECT count(*) FROM token_steps").fetchall() == [(given.tables["token_steps"].num_rows,)]
    assert database.sql("SELECT * FROM stats").fetchall() == [(1,)]
