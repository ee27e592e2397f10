"""The TRL integration's replay (docs/trl.md, "Replaying a baseline's rollout"; docs/replay.md).

With `replay_from` set, GRPOTrainer consumes the baseline's rollout instead of generating its own,
through the hooks TRL documents for it: the trainer's `rollout_func` (GRPOTrainer(rollout_func=...),
which TRL calls in place of its generation) returns the baseline's prompt and completion ids (and
the rollout engine's log-probs where the baseline saved them), and each of `trainer.reward_funcs`
becomes a reward function returning the baseline's `rewards/<function>`. TRL decodes, pads, scores
and normalises them as its own, so the trainer side (old, ref and current log-probs, advantages,
loss, gradients) runs on the baseline's tokens. Both are put back when the integration detaches.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from rlprobe.errors import ProbeError

IDS = torch.zeros(0, 0, dtype=torch.int64)  # the layouts replay() checks the baseline's tensors against
FLOATS_2D = torch.zeros(0, 0, dtype=torch.float32)
FLOATS = torch.zeros(0, dtype=torch.float32)


class ReplayHooks:
    """The rollout_func and reward functions installed on one GRPOTrainer (attach() refuses a trainer without
    rollout_func); `remove()` restores the trainer's own."""

    def __init__(self, trainer: Any, probe: Any, replay_from: str):
        self.trainer, self.probe, self.replay_from = trainer, probe, replay_from
        self.logprobs = _saved_logprobs(replay_from, trainer.accelerator.process_index)
        self.rollout_func, self.reward_funcs = trainer.rollout_func, list(trainer.reward_funcs)
        trainer.rollout_func = self.rollout
        for i, name in enumerate(trainer.reward_func_names):
            trainer.reward_funcs[i] = self.reward(name)

    def remove(self) -> None:
        self.trainer.rollout_func = self.rollout_func
        self.trainer.reward_funcs[:] = self.reward_funcs

    def rollout(self, prompts: list, trainer: Any) -> dict[str, Any]:
        """TRL's rollout_func: the baseline's ids of this step, rank and generation."""
        live = {"prompts": IDS, "prompt_mask": IDS, "responses": IDS, "response_mask": IDS}
        if self.logprobs:
            live["rollout_log_prob"] = FLOATS_2D
        base = self.probe.replay(live)
        rows = base["responses"].shape[0]
        if rows != len(prompts):
            raise ProbeError(f"replay from {self.replay_from}: step {self.probe.current_step} rank "
                             f"{trainer.accelerator.process_index}: the baseline's rollout has {rows} completions where "
                             f"this generation has {len(prompts)} prompts; replay needs the baseline's batch layout "
                             "(per_device_train_batch_size, num_generations, steps_per_generation, processes)")
        pad = _pad_token(trainer)
        prompt_ids = [row[mask.bool()].tolist() for row, mask in zip(base["prompts"], base["prompt_mask"])]
        completion_ids = []
        for row, mask in zip(base["responses"], base["response_mask"]):
            ids = row[mask.bool()].tolist()
            if not ids:  # masked as truncated (mask_truncated_completions): the whole row, padding stripped
                ids = row.tolist()
                while ids and ids[-1] == pad:
                    ids.pop()
            completion_ids.append(ids)
        logprobs = None
        if self.logprobs:
            logprobs = [lp[:len(ids)].tolist() for lp, ids in zip(base["rollout_log_prob"], completion_ids)]
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    def reward(self, name: str) -> Callable[..., list]:
        """A reward function returning the baseline's `rewards/<name>` of this generation."""
        key = f"rewards/{name}"

        def replayed(prompts: Any = None, completions: Any = None, **kwargs: Any) -> list:
            values = self.probe.replay({key: FLOATS})[key].tolist()
            if completions is not None and len(values) != len(completions):
                raise ProbeError(f"replay from {self.replay_from}: key {key!r} step {self.probe.current_step}: the "
                                 f"baseline has {len(values)} rewards for {len(completions)} completions")
            return [None if math.isnan(v) else v for v in values]  # TRL reads None as NaN, as it saved them

        replayed.__name__ = name
        return replayed


def _pad_token(trainer: Any) -> Any:
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    return getattr(tokenizer, "pad_token_id", None)


def _saved_logprobs(replay_from: str, rank: int) -> bool:
    """Whether the baseline saved the rollout engine's log-probs (TRL's sampling_per_token_logps) as tensors."""
    import pyarrow.compute as pc

    from rlprobe.lake.reader import open_dump

    table = open_dump(replay_from).arrow("key_data")
    mask = pc.and_(pc.and_(pc.equal(table["key"], "rollout_log_prob"), pc.equal(table["rank"], rank)),
                   pc.is_valid(table["tensor_file"]))
    return table.filter(mask).num_rows > 0
