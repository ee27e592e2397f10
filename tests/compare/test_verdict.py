"""The verdict's words where the config and the stages tell more than the key data (issue 41, item 6):
a changed loss type, advantage estimator or reward scaling is the suspect's config note; a changed
seed is named as the data order; a reward divergence names a reward model only where a run has one.
The dumps are written by rlprobe.Probe, their configs as the TRL integration saves them
(rlprobe.integrations.trl.config_snapshot: the trainer's args, its models, the reward functions)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rlprobe


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ("RLPROBE_RUN_ID", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def trl_config(**args) -> dict:
    """A GRPOTrainer's config as config_snapshot saves it: a rule-based reward function, no reward model."""
    return {"trainer": "GRPOTrainer", "args": {"loss_type": "grpo", "scale_rewards": "group", "beta": 0.0,
                                               "seed": 42, "learning_rate": 1e-6, **args},
            "models": {"policy": {"class": "Qwen2ForCausalLM", "dtypes": ["torch.float32"]}},
            "reward_funcs": ["accuracy_reward"], "reward_weights": [1.0]}


def run(path: Path, config: dict, steps: list[dict]) -> Path:
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        probe.save_config(config)
        for values in steps:
            probe.save(values)
            probe.step()
    return path


PROMPTS = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]])
RESPONSES = torch.tensor([[1, 2, 3], [4, 5, 6]])
REWARDS = torch.tensor([1.0, 0.0])
ADVANTAGES = torch.tensor([0.70710677, -0.70710677])


def step(**changed) -> dict:
    return {"prompts": PROMPTS, "responses": RESPONSES, "rewards": REWARDS, "advantages": ADVANTAGES,
            "loss": torch.tensor(0.25), **changed}


def test_a_changed_loss_type_is_the_config_note_of_a_loss_divergence(tmp_path):
    a = run(tmp_path / "a", trl_config(), [step()])
    b = run(tmp_path / "b", trl_config(loss_type="dr_grpo"), [step(loss=torch.tensor(0.125))])
    summary = rlprobe.compare(a, b, tmp_path / "o", reports=False)
    assert (summary["first_divergence"]["key"], summary["first_divergence"]["step"]) == ("loss", 0)
    assert [(c["path"], c["family"]) for c in summary["config_cause"]] == [("args.loss_type", "loss")]
    assert summary["suspect"].startswith('config: loss type or aggregation changed: args.loss_type: A="grpo", '
                                         'B="dr_grpo" -> loss diverges first at step 0')


@pytest.mark.parametrize("path, a_value, b_value, family", [
    ("args.scale_rewards", "group", "none", "reward_scaling"),  # TRL: the std the advantages are divided by
    ("algorithm.adv_estimator", "gae", "grpo", "advantage"),  # verl
    ("advantage_estimator", "gae", "reinforce", "advantage"),  # OpenRLHF
])
def test_an_advantage_or_reward_scaling_setting_is_the_config_note_of_an_advantage_divergence(
        tmp_path, path, a_value, b_value, family):
    def config(value):
        cfg = trl_config()
        node = cfg
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
        return cfg

    a = run(tmp_path / "a", config(a_value), [step()])
    b = run(tmp_path / "b", config(b_value), [step(advantages=torch.tensor([1.0, -1.0]))])
    summary = rlprobe.compare(a, b, tmp_path / "o", reports=False)
    assert summary["first_divergence"]["key"] == "advantages"
    assert [(c["path"], c["family"]) for c in summary["config_cause"]] == [(path, family)]
    assert "-> advantages diverges first at step 0" in summary["suspect"]


def test_a_changed_seed_is_named_as_the_data_order_of_a_shape_mismatch(tmp_path):
    a = run(tmp_path / "a", trl_config(), [step()])
    b = run(tmp_path / "b", trl_config(seed=7), [step(prompts=torch.tensor([[3, 4, 5], [7, 8, 9]]))])
    summary = rlprobe.compare(a, b, tmp_path / "o", reports=False)
    assert summary["first_divergence"]["status"] == "shape_mismatch"
    assert ("'prompts' has different shapes at step 0, rank 0, micro_step 0: the data order differs, because the "
            "seed differs (args.seed: A=42, B=7)") in summary["suspect"]
    assert "batch or sequence sizes" not in summary["suspect"]
    # without a changed seed the sizes are what differs
    c = run(tmp_path / "c", trl_config(), [step(prompts=torch.tensor([[3, 4, 5], [7, 8, 9]]))])
    summary = rlprobe.compare(a, c, tmp_path / "o2", reports=False)
    assert "the runs used different batch or sequence sizes" in summary["suspect"]


def test_rewards_of_reward_functions_name_the_function_and_advise_no_module_dump(tmp_path):
    a = run(tmp_path / "a", trl_config(), [step()])
    b = run(tmp_path / "b", trl_config(), [step(rewards=torch.tensor([0.0, 0.0]))])
    summary = rlprobe.compare(a, b, tmp_path / "o", reports=False)
    assert summary["first_divergence"]["key"] == "rewards"
    assert "-> the reward function (rule-based; the saved configs name no reward model)" in summary["suspect"]
    assert "reward model" not in summary["advice"] and summary["next_config"] is None


def test_rewards_of_a_run_with_a_reward_model_name_its_forward_and_advise_its_dump(tmp_path):
    with_model = trl_config()
    with_model["models"]["reward/Skywork-Reward"] = {"class": "Qwen2ForSequenceClassification"}
    with_model["reward_funcs"] = ["Skywork-Reward"]
    a = run(tmp_path / "a", with_model, [step()])
    b = run(tmp_path / "b", with_model, [step(rewards=torch.tensor([0.0, 0.0]))])
    summary = rlprobe.compare(a, b, tmp_path / "o", reports=False)
    assert "-> the reward: the reward model's forward" in summary["suspect"]
    assert summary["next_config"]["rlprobe_config"]["stages"] == ["reward_compute"]


def test_rewards_of_runs_without_a_saved_config_keep_both_possibilities(tmp_path):
    def bare(path, values):
        with rlprobe.Probe(path, rank=0, world_size=1) as probe:
            probe.save(values)
            probe.step()
        return path

    summary = rlprobe.compare(bare(tmp_path / "a", step()), bare(tmp_path / "b", step(rewards=torch.tensor([0.0, 0.0]))),
                              tmp_path / "o", reports=False)
    assert "the reward model's forward or the rule-based reward function" in summary["suspect"]


def test_a_switched_off_reward_model_is_no_reward_model(tmp_path):
    """verl's reward_model.enable: false keeps the reward_model section in the config."""
    config = {"reward_model": {"enable": False, "model": {"path": "some/rm"}},
              "custom_reward_function": {"path": "reward.py", "name": "compute_score"}}
    a = run(tmp_path / "a", config, [step()])
    b = run(tmp_path / "b", config, [step(rewards=torch.tensor([0.0, 0.0]))])
    summary = rlprobe.compare(a, b, tmp_path / "o", reports=False)
    assert "-> the reward function (rule-based" in summary["suspect"] and summary["next_config"] is None


def test_the_amplification_point_takes_the_config_note_of_its_own_key(tmp_path):
    """A tolerance under the noise makes rewards one float32 ulp apart the first divergence; the advantages, off
    by 0.3 from inputs one ulp apart, are the amplification point and lead the suspect, and the changed GAE
    lambda explains them (it could not explain rewards, nor anything at step 0 through the update)."""
    a = run(tmp_path / "a", {"ppo": {"lam": 0.95}}, [step()])
    b = run(tmp_path / "b", {"ppo": {"lam": 0.5}},
            [step(rewards=torch.tensor([float(torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))), 0.0]),
                  advantages=torch.tensor([1.0, -1.0]))])
    summary = rlprobe.compare(a, b, tmp_path / "o", reports=False, rtol=1e-9, atol=0)
    assert summary["first_divergence"]["key"] == "rewards"
    amplification = summary["amplification"]
    assert (amplification["key"], amplification["upstream_key"], amplification["leads"]) == \
        ("advantages", "rewards", True)
    assert amplification["ratio"] > 1e3
    assert [c["path"] for c in summary["config_cause"]] == ["ppo.lam"]
    assert summary["suspect"].startswith("config: advantage setting changed: ppo.lam: A=0.95, B=0.5 -> the error of "
                                         "advantages jumps at step 0")
    assert "the first divergence beyond tolerance, rewards at step 0" in summary["suspect"]


def test_weights_apart_by_amplified_rounding_leave_tokens_parting_by_sampling():
    """settle_parting: a fingerprint difference after update 0 names the update as the parting's cause, unless
    it is rounding noise the optimizer amplified (params.update_noise): then the tokens part under noise."""
    from rlprobe.comparison.verdict import settle_parting

    def summary(noise):
        return {"parting": {"step": 1, "cause": "sampling", "evidence": [], "consequences": []},
                "suspect": "responses differ from step 1 (sampling under rounding noise: ...)",
                "param_first_difference": {"monitor": "actor", "probe_step": 0, "param": "embed.weight"},
                "update_noise": noise}

    changed, noise = summary(None), summary({"monitor": "actor", "update": 0, "params": 1})
    settle_parting(changed)
    settle_parting(noise)
    assert changed["parting"]["cause"] == "update" and changed["suspect"].startswith("the parameter update after step 0")
    assert noise["parting"]["cause"] == "sampling" and noise["suspect"].startswith("responses differ from step 1")
