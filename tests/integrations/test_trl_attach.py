"""rlprobe.integrations.trl.attach on real TRL trainers: RewardTrainer, the guards that refuse a
TRL whose methods changed, and the cases where nothing (or nothing more) may be written."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import rlprobe
from rlprobe.errors import ProbeError
from rlprobe.integrations.trl import SUPPORTED_TRL, attach

from .trl_runs import example


@pytest.fixture(scope="module")
def ex():
    return example()


def grpo_trainer(ex, tmp_path, model_dir, cls=None):
    """A GRPOTrainer of the example's configuration (a subclass `cls` of it when given)."""
    from trl import GRPOConfig, GRPOTrainer
    from transformers import AutoModelForCausalLM

    cfg = ex.load_config()
    args = GRPOConfig(**cfg["grpo"], output_dir=str(tmp_path / "out"), report_to="none", save_strategy="no",
                      use_cpu=True, disable_tqdm=True)
    return (cls or GRPOTrainer)(model=AutoModelForCausalLM.from_pretrained(model_dir),
                                reward_funcs=[ex.tiny.even_words], args=args, train_dataset=ex.tiny.prompt_dataset(),
                                processing_class=ex.tiny.build_tokenizer())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, ex):
    return ex.tiny.build_model_dir(tmp_path_factory.mktemp("tiny_qwen2"))


def test_reward_trainer_saves_chosen_and_rejected_rewards_and_the_loss(ex, tmp_path):
    from transformers import Qwen2Config, Qwen2ForSequenceClassification
    from trl import RewardConfig, RewardTrainer
    from datasets import Dataset

    tokenizer = ex.tiny.build_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForSequenceClassification(Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_labels=1, pad_token_id=tokenizer.pad_token_id))
    pairs = Dataset.from_dict({"chosen": ["two even two", "even even", "two two even", "even"] * 2,
                               "rejected": ["odd cat", "dog odd red", "one", "blue bird odd"] * 2})
    args = RewardConfig(output_dir=str(tmp_path / "out"), report_to="none", save_strategy="no", use_cpu=True,
                        disable_tqdm=True, max_steps=2, per_device_train_batch_size=4, logging_steps=1,
                        learning_rate=1e-3)
    trainer = RewardTrainer(model=model, args=args, train_dataset=pairs, processing_class=tokenizer)
    attach(trainer, dump_path=tmp_path / "dump")
    trainer.train()
    d = rlprobe.open(tmp_path / "dump")
    assert d.complete
    saved = d.key_data().collect().to_dicts()
    assert {(r["key"], r["step"]) for r in saved} == {(k, s) for k in ("input_ids", "rewards_chosen",
                                                                       "rewards_rejected", "loss") for s in (0, 1)}
    for step in range(2):
        chosen = d.tensor("rewards_chosen", step=step, rank=0, micro_step=0)
        rejected = d.tensor("rewards_rejected", step=step, rank=0, micro_step=0)
        assert chosen.shape == rejected.shape == (4,)
        loss = d.tensor("loss", step=step, rank=0, micro_step=0)
        # RewardTrainer's pairwise loss, recomputed from the saved rewards
        expected = -np.log(1 / (1 + np.exp(-(chosen.astype(np.float64) - rejected))))
        assert float(loss) == pytest.approx(expected.mean(), rel=1e-5)
    scalars = {(r["step"], r["name"]): r["value"] for r in d.scalars().collect().to_dicts()}
    assert scalars[(0, "loss")] == pytest.approx(float(d.tensor("loss", step=0, rank=0, micro_step=0)), rel=1e-5)
    grads = {(g["monitor"], g["step"]) for g in d.arrow("grad").to_pylist()}
    assert grads == {("reward_model", 0), ("reward_model", 1)}


def test_a_changed_trl_method_is_refused_naming_it_and_the_supported_versions(ex, tmp_path, model_dir):
    from trl import GRPOTrainer

    class Changed(GRPOTrainer):  # as if a TRL release renamed the parameters of a wrapped method
        def _calculate_rewards(self, batch, prompts, completions, completion_ids_list):
            return super()._calculate_rewards(batch, prompts, completions, completion_ids_list)

    trainer = grpo_trainer(ex, tmp_path, model_dir, Changed)
    with pytest.raises(ProbeError) as e:
        attach(trainer, dump_path=tmp_path / "dump")
    message = str(e.value)
    assert "_calculate_rewards(batch, prompts, completions, completion_ids_list)" in message
    assert "_calculate_rewards(inputs, prompts, completions, completion_ids_list" in message
    assert SUPPORTED_TRL in message
    assert not (tmp_path / "dump").exists()  # refused before anything was written
    assert "_calculate_rewards" not in trainer.__dict__  # nothing installed


def test_a_trainer_the_integration_does_not_know_is_refused(ex, tmp_path):
    from trl import SFTConfig, SFTTrainer
    from datasets import Dataset
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = ex.tiny.build_tokenizer()
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    trainer = SFTTrainer(model=model, args=SFTConfig(output_dir=str(tmp_path / "out"), report_to="none",
                                                     use_cpu=True, max_steps=1),
                         train_dataset=Dataset.from_dict({"text": ["red cat", "two even"]}),
                         processing_class=tokenizer)
    with pytest.raises(ProbeError, match="SFTTrainer is not a trainer the integration knows: it captures "
                                         "GRPOTrainer, RLOOTrainer"):
        attach(trainer, dump_path=tmp_path / "dump")


def test_a_trl_outside_the_tested_range_warns(ex, tmp_path, model_dir, monkeypatch):
    import trl

    trainer = grpo_trainer(ex, tmp_path, model_dir)
    monkeypatch.setattr(trl, "__version__", "1.99.0")
    with pytest.warns(RuntimeWarning, match=r"tested with TRL >=1\.16,<1\.17 .* this is TRL 1\.99\.0"):
        handle = attach(trainer, dump_path=tmp_path / "dump")
    handle.close()


def test_nothing_switched_on_installs_nothing_and_writes_nothing(ex, tmp_path, model_dir):
    trainer = grpo_trainer(ex, tmp_path, model_dir)
    handle = attach(trainer, {"rlprobe_config": {"enable": False, "dump_path": str(tmp_path / "dump"),
                                                 "key_data_dump": True}})
    assert not handle.enabled
    assert not any(name in trainer.__dict__ for name in ("compute_loss", "_calculate_rewards", "training_step"))
    trainer.args.max_steps = 1
    trainer.train()
    assert not (tmp_path / "dump").exists()


def test_a_probe_behind_trls_global_step_is_refused_at_train_begin(ex, tmp_path, model_dir):
    trainer = grpo_trainer(ex, tmp_path, model_dir)
    attach(trainer, dump_path=tmp_path / "dump", start_step=5)
    with pytest.raises(ProbeError, match="TRL is at global step 0 .* the probe .* is at step 5; pass start_step=0"):
        trainer.train()


def test_attaching_twice_is_refused_and_close_removes_the_hooks(ex, tmp_path, model_dir):
    trainer = grpo_trainer(ex, tmp_path, model_dir)
    handle = attach(trainer, dump_path=tmp_path / "dump")
    assert "compute_loss" in trainer.__dict__
    with pytest.raises(ProbeError, match="already attached"):
        attach(trainer, dump_path=tmp_path / "dump2")
    handle.close()
    assert not any(name in trainer.__dict__ for name in ("compute_loss", "_calculate_rewards", "_rlprobe_trl"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attach(trainer, dump_path=tmp_path / "dump3").close()
