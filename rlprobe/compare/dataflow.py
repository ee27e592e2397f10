"""The order in which PPO/GRPO data is produced, used to pick the *first* divergence in a step.

DESIGN.md's default order, plus `token_level_rewards` (the scores minus the KL penalty, as
verl names them) right after `kl`, where it is computed. Trainers' names and spellings of these
keys are rlprobe/key_names.csv (rlprobe.key_names)."""

from __future__ import annotations

DEFAULT_ORDER = (
    "prompts", "responses", "rollout_log_prob",  # the inference engine's log-probs, with the rollout
    "rewards", "token_level_scores", "values", "old_log_prob", "ref_log_prob",
    "kl", "token_level_rewards", "advantages", "returns", "log_prob", "ratio", "pg_loss", "vf_loss", "kl_loss", "entropy", "loss",
)
