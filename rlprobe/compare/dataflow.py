"""The order in which PPO/GRPO data is produced, used to pick the *first* divergence in a step.

DESIGN.md's default order, plus `token_level_rewards` (the scores minus the KL penalty, as
verl names them) right after `kl`, where it is computed."""

from __future__ import annotations

DEFAULT_ORDER = (
    "prompts", "responses", "rollout_log_prob",  # the inference engine's log-probs, with the rollout
    "rewards", "token_level_scores", "values", "old_log_prob", "ref_log_prob",
    "kl", "token_level_rewards", "advantages", "returns", "log_prob", "ratio", "pg_loss", "vf_loss", "kl_loss", "entropy", "loss",
)
# singular and misspelt forms seen in the wild (msprobe's docs use ref_log_probe / old_log_probe)
ALIASES = {
    "prompt": "prompts", "response": "responses", "reward": "rewards", "value": "values",
    "advantage": "advantages", "return": "returns", "ref_log_probe": "ref_log_prob",
    "old_log_probe": "old_log_prob", "log_probe": "log_prob", "old_log_probs": "old_log_prob",
    "ref_log_probs": "ref_log_prob", "log_probs": "log_prob", "ref_logprob": "ref_log_prob",
    "old_logprob": "old_log_prob", "logprob": "log_prob",
}


def canonical(key: str) -> str:
    return ALIASES.get(key, key)

