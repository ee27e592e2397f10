"""`rlprobe check` on the TRL example's dumps (the session's shared runs)."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

import rlprobe  # noqa: E402


def statuses(result) -> dict[str, str]:
    return {r["check"]: r["status"] for r in result.results.to_pylist()}


def test_the_trl_grpo_dump_is_checked(trl_runs):
    result = rlprobe.check(trl_runs.get("base"))
    got = statuses(result)
    assert result.exit_code == 0, result.results.to_pylist()
    # GRPO groups from save(group_ids=...); each group's advantages sum to 0
    assert got["grpo_advantages"] == "pass"
    groups = result.tables["group_advantages"].to_pylist()
    assert groups and {g["group_source"] for g in groups} == {"save(group_ids=...)"}
    assert {g["sequences"] for g in groups} == {4}  # num_generations
    assert got["nonfinite"] == "pass" and got["loss_finite"] == "pass"
    assert got["grad_norm_spike"] == "pass"
    # TRL computes no old log-probs with num_iterations 1, and samples without vLLM: not applicable
    assert got["on_policy"] == "not_applicable" and got["rollout_vs_recompute"] == "not_applicable"


def test_trl_rollout_log_probs_are_checked_against_the_trainer_by_sample(trl_runs):
    import numpy as np

    from .test_trl_capture import aligned

    dump = trl_runs.get("rollout_func", rollout_func=True)
    result = rlprobe.check(dump, max_mean_abs_delta=1.0, max_outside_share=1.0, max_abs_delta=100.0)
    assert statuses(result)["rollout_vs_recompute"] == "pass", result.results.to_pylist()
    steps = result.tables["token_steps"].to_pylist()
    assert {r["pair"] for r in steps} == {"rollout_vs_log_prob"}  # num_iterations 1: no old log-probs
    assert sorted(r["step"] for r in steps) == [0, 1, 2]
    for row in steps:  # the same figures from numpy, rows matched here by the saved sample ids
        rollout, log_prob = aligned(dump, row["step"], "rollout_log_prob")
        mask, _ = aligned(dump, row["step"], "response_mask")
        delta = (rollout.astype(np.float64) - log_prob.astype(np.float64))[mask.astype(bool)]
        assert row["tokens"] == delta.size > 0
        assert row["mean_abs"] == pytest.approx(np.abs(delta).mean(), rel=1e-6, abs=1e-12)
        assert row["max_abs"] == pytest.approx(np.abs(delta).max(), rel=1e-6, abs=1e-12)
        assert row["mean_delta"] == pytest.approx(delta.mean(), rel=1e-6, abs=1e-12)
