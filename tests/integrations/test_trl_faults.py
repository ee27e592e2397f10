"""Planted faults in a real TRL GRPO run (examples/trl_grpo) and what `rlprobe compare` says.

The config diff (issue 14) names the changed setting of each fault; parameter fingerprints name
the update that differs."""

from __future__ import annotations

import json

import pytest

import rlprobe


def compare(runs, a: str, b: str, tmp_path) -> dict:
    return rlprobe.compare(runs.get(a), runs.get(b), tmp_path / "out")


def first(summary: dict) -> tuple[str, int]:
    fd = summary["first_divergence"]
    return fd["key"], fd["step"]


def test_two_seeded_runs_do_not_diverge(trl_runs, tmp_path):
    trl_runs.get("base")
    summary = compare(trl_runs, "base", "base_again", tmp_path)
    assert summary["first_divergence"] is None
    # 45 (key, step, call) pairs: sample and group ids are sample rows now (save(sample_ids=)), not keys
    assert summary["counts"].get("mismatch", 0) == 0 and summary["counts"]["match"] >= 45
    # old_log_prob (TRL computes none with num_iterations=1) is absent in both, not a divergence
    assert summary["counts"]["absent_in_both"] > 0


def test_reference_in_bf16_names_ref_log_prob_and_then_the_embedding(trl_runs, tmp_path):
    summary = compare(trl_runs, "base", "fault_ref_bf16", tmp_path)
    assert first(summary) == ("ref_log_prob", 0)
    assert "the reference model's forward" in summary["suspect"]
    assert "prompts, responses identical" in summary["suspect"]
    advised = summary["next_config"]["rlprobe_config"]
    assert advised["stages"] == ["reference_compute_log_prob"] and advised["step_start"] == 0
    # the advised dump, run on both, names the first module whose output differs
    overrides = {"rlprobe_config": {**advised, "dump_path": "set-by-runs"}, "grpo.max_steps": advised["step_end"] + 1}
    a = trl_runs.get("modules_base", **overrides)
    b = trl_runs.get("modules_ref_bf16", fault="ref-bf16", **overrides)
    modules = rlprobe.compare(a, b, tmp_path / "modules")["module_first_divergence"]
    assert modules["stage"] == "reference_compute_log_prob" and modules["step"] == 0
    assert modules["module"] == "model.embed_tokens" and modules["inputs_match"] is True
    assert modules["status"] == "dtype_mismatch"


def test_temperature_names_the_responses_and_rollout_sampling(trl_runs, tmp_path):
    summary = compare(trl_runs, "base", "fault_temperature", tmp_path)
    assert first(summary) == ("responses", 0)
    assert summary["suspect"].endswith("rollout sampling: generation produced different tokens from the same prompts")
    assert "temperature" in summary["advice"]


def test_sampling_seed_names_the_responses_and_rollout_sampling(trl_runs, tmp_path):
    summary = compare(trl_runs, "base", "fault_sampling_seed", tmp_path)
    assert first(summary) == ("responses", 0)
    assert "(prompts identical) -> rollout sampling" in summary["suspect"]
    assert "sampling seed" in summary["advice"]


def test_beta_names_the_loss(trl_runs, tmp_path):
    summary = compare(trl_runs, "base", "fault_beta", tmp_path)
    # step 1: at step 0 the policy equals the reference, so the KL term and its gradient are 0
    assert first(summary) == ("loss", 1)
    assert "the loss computation for 'loss'" in summary["suspect"]


def test_learning_rate_names_the_update_after_step_0(trl_runs, tmp_path):
    summary = compare(trl_runs, "base", "fault_lr", tmp_path)
    assert first(summary) == ("responses", 1)
    assert "responses diverges first at step 1" in summary["suspect"]


@pytest.mark.parametrize("fault, setting", [("ref-bf16", "model_init_kwargs"), ("beta", "beta"),
                                            ("temperature", "temperature"), ("lr", "learning_rate"),
                                            ("sampling-seed", "seed")])
def test_the_changed_setting_is_named(trl_runs, tmp_path, fault, setting):
    summary = compare(trl_runs, "base", f"fault_{fault.replace('-', '_')}", tmp_path)
    beyond_advice = json.dumps({k: v for k, v in summary.items() if k != "advice"})
    assert f'"{setting}"' in beyond_advice or f"{setting}:" in beyond_advice or f"{setting} " in beyond_advice


def test_learning_rate_names_the_update_by_its_fingerprint(trl_runs, tmp_path):
    summary = compare(trl_runs, "base", "fault_lr", tmp_path)
    assert "the update of step 0 differs for model 'actor' (first parameter " in summary["suspect"]
    assert summary["param_first_difference"]["probe_step"] == 0


def test_a_changed_loss_type_is_the_config_note_of_the_loss(trl_runs, tmp_path):
    """TRL's loss_type (dapo -> dr_grpo: another normalisation of the summed token losses) belongs to the loss
    family: the changed setting leads the suspect of the loss it changes."""
    summary = rlprobe.compare(trl_runs.get("base"), trl_runs.get("loss_type_dr_grpo", **{"grpo.loss_type": "dr_grpo"}),
                              tmp_path / "out")
    assert first(summary)[0] == "loss"
    assert [(c["path"], c["family"]) for c in summary["config_cause"]] == [("args.loss_type", "loss")]
    assert summary["suspect"].startswith('config: loss type or aggregation changed: args.loss_type: A="dapo", '
                                         'B="dr_grpo" -> ')


def test_a_reward_of_reward_functions_is_named_without_a_reward_model(trl_runs, tmp_path):
    """The example's rewards are two Python functions: its saved config names them (reward_funcs) and no
    reward model, so a reward divergence (their weights changed: the weighted total differs, each function's
    own rewards do not) names the reward function, with the weights as its config note, and no module dump."""
    summary = rlprobe.compare(trl_runs.get("base"), trl_runs.get("reward_weights", **{"grpo.reward_weights": [1.0, 0.5]}),
                              tmp_path / "out")
    assert first(summary) == ("rewards", 0)
    # GRPOConfig's reward_weights and the snapshot's own (config_snapshot saves the trainer's weights beside its args)
    assert {(c["path"], c["family"]) for c in summary["config_cause"]} == {("args.reward_weights", "reward_scaling"),
                                                                            ("reward_weights", "reward_scaling")}
    assert "-> rewards diverges first at step 0" in summary["suspect"]
    assert "the reward function (rule-based; the saved configs name no reward model)" in summary["suspect"]
    assert summary["next_config"] is None and "reward model" not in summary["advice"]
