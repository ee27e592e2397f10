"""rlprobe_config.replay_from with the real GRPOTrainer (rlprobe/integrations/trl_replay.py): the
generated completions and their rewards are the baseline's, the trainer side is this run's."""

from __future__ import annotations

import numpy as np
import pytest

import rlprobe
from rlprobe.errors import ProbeError

STEPS = 3
ROLLOUT = ("prompts", "prompt_mask", "responses", "response_mask", "rewards", "rewards/even_words",
           "rewards/short_answer", "rollout_log_prob", "advantages")


def same(a, b, key: str, step: int) -> bool:
    x, y = rlprobe.open(a).tensor(key, step), rlprobe.open(b).tensor(key, step)
    return x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True)


@pytest.fixture(scope="module")
def runs(trl_runs):
    # the baseline generates through TRL's rollout_func, so its rollout log-probs are saved and replayed too
    base = trl_runs.get("rollout_func", rollout_func=True)
    sampled = trl_runs.get("rollout_func_sampling_seed", fault="sampling-seed", rollout_func=True)
    replayed = trl_runs.get("replay_sampling_seed", fault="sampling-seed", rollout_func=True,
                            **{"rlprobe_config.replay_from": str(base)})
    return base, sampled, replayed


def test_the_replayed_rollout_is_the_baseline_s_at_every_step(runs):
    base, sampled, replayed = runs
    for step in range(STEPS):
        for key in ROLLOUT:
            assert same(base, replayed, key, step), (key, step)
        # the frozen reference scores this run's (replayed) tokens: its trainer side runs on them
        assert same(base, replayed, "ref_log_prob", step)
    # without replay the other seed samples other completions
    assert not all(same(base, sampled, "responses", step) for step in range(STEPS))


def test_the_replayed_run_records_its_baseline(runs):
    base, _, replayed = runs
    assert rlprobe.open(replayed).manifest["replay_from"]["path"] == str(base.resolve())


def test_replay_puts_the_trainer_s_own_rollout_func_and_rewards_back(trl_runs, tmp_path):
    ex = trl_runs.ex
    cfg = ex.load_config(overrides={"rollout_func": True, "grpo.max_steps": 1})
    cfg["rlprobe_config"].update(dump_path=str(tmp_path / "b"), replay_from=str(trl_runs.get("rollout_func",
                                                                                            rollout_func=True)))
    trainer = ex.build_trainer(cfg, tmp_path / "out", trl_runs.model_dir)
    funcs = list(trainer.reward_funcs)
    from rlprobe.integrations.trl import attach

    with attach(trainer, cfg):
        assert trainer.rollout_func is not ex.cpu_rollout
        assert [f.__name__ for f in trainer.reward_funcs] == ["even_words", "short_answer"]
        assert trainer.reward_funcs != funcs
    assert trainer.rollout_func is ex.cpu_rollout and trainer.reward_funcs == funcs


def test_replay_into_a_trainer_without_rollout_func_is_refused(trl_runs, tmp_path):
    ex = trl_runs.ex
    cfg = ex.load_config(overrides={"trainer": "rloo", "grpo.max_steps": 1})
    cfg["rlprobe_config"].update(dump_path=str(tmp_path / "b"), replay_from=str(trl_runs.get("base")))
    trainer = ex.build_trainer(cfg, tmp_path / "out", trl_runs.model_dir)
    from rlprobe.integrations.trl import attach

    with pytest.raises(ProbeError, match=r"replay_from=.*RLOOTrainer has no rollout_func.*replay supports GRPOTrainer"):
        attach(trainer, cfg)
    with pytest.raises(ProbeError, match=r"RLOOTrainer has no rollout_func"):
        attach(trainer, dump_path=tmp_path / "b", replay_from=trl_runs.get("base"))
    assert not (tmp_path / "b").exists()  # refused before a probe was made
