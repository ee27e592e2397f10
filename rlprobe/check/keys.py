"""The names trainers give the keys the checks read (rlprobe's, TRL's, verl's, OpenRLHF's), mapped
to the one canonical name each check's SQL uses (column `canonical` of the `stats` table)."""

from __future__ import annotations

ALIASES: dict[str, tuple[str, ...]] = {
    "log_prob": ("log_prob", "log_probs", "per_token_logps", "action_log_probs"),
    "old_log_prob": ("old_log_prob", "old_log_probs", "old_per_token_logps", "old_action_log_probs"),
    "rollout_log_prob": ("rollout_log_prob", "rollout_log_probs", "sampling_per_token_logps"),
    "ref_log_prob": ("ref_log_prob", "ref_log_probs", "ref_per_token_logps", "base_action_log_probs"),
    "kl": ("kl", "kl_penalty"),
    "advantages": ("advantages", "advantage"),
    "rewards": ("rewards", "reward", "scores"),
    "entropy": ("entropy", "entropies"),
    "response_mask": ("response_mask", "completion_mask", "action_mask"),
    "group_ids": ("group_ids",),
    "epoch": ("epoch", "ppo_epoch", "iteration"),
}
CANONICAL = {alias: name for name, aliases in ALIASES.items() for alias in aliases}

# keys and scalars that are a loss: the finite-loss check reads them (besides any name ending in "loss")
LOSS_NAMES = ("loss", "pg_loss", "vf_loss", "policy_loss", "value_loss", "actor/pg_loss", "critic/vf_loss")

# config leaves (the last path component) that the checks read; docs/check.md lists them
CLIP_CONFIG = ("clip_ratio", "cliprange", "clip_range", "clip_eps", "epsilon", "clip")
GROUP_SIZE_CONFIG = ("num_generations", "group_size", "n_samples_per_prompt")
REF_FROM_ACTOR_CONFIG = ("ref_starts_as_actor",)


def canonical(key: str) -> str:
    """The canonical name of a saved key (the key itself when it has none)."""
    return CANONICAL.get(key, key)
