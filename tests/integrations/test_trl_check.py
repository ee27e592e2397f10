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
    # GRPO groups from the saved group_ids; each group's advantages sum to 0
    assert got["grpo_advantages"] == "pass"
    groups = result.tables["group_advantages"].to_pylist()
    assert groups and {g["group_source"] for g in groups} == {"saved group_ids"}
    assert {g["sequences"] for g in groups} == {4}  # num_generations
    assert got["nonfinite"] == "pass" and got["loss_finite"] == "pass"
    assert got["grad_norm_spike"] == "pass"
    # TRL computes no old log-probs with num_iterations 1, and samples without vLLM: not applicable
    assert got["on_policy"] == "not_applicable" and got["rollout_vs_recompute"] == "not_applicable"


def test_trl_sampling_log_probs_are_never_paired_with_shuffled_micro_batches(trl_runs):
    result = rlprobe.check(trl_runs.get("rollout_func", rollout_func=True))
    assert result.exit_code == 0, result.results.to_pylist()
    pairs = set(result.tables["token_steps"]["pair"].to_pylist())
    assert not pairs & {"rollout_vs_log_prob", "rollout_vs_old"}  # TRL saves sample_ids: rows are other samples
    note = next(r for r in result.results.to_pylist() if r["check"] == "rollout_vs_recompute")
    assert note["status"] == "not_applicable" and "sample id" in note["note"]
