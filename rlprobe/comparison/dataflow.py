"""The order in which PPO/GRPO data is produced, used to pick the *first* divergence in a step, and
what each key is computed from (the verdict's rules and the amplification point).

DESIGN.md's default order, plus `token_level_rewards` (the scores minus the KL penalty, as
verl names them) right after `kl`, where it is computed. Trainers' names and spellings of these
keys are rlprobe/key_names.csv (rlprobe.key_names)."""

from __future__ import annotations

import functools

DEFAULT_ORDER = (
    "prompts", "responses", "rollout_log_prob",  # the inference engine's log-probs, with the rollout
    "rewards", "token_level_scores", "values", "old_log_prob", "ref_log_prob",
    "kl", "token_level_rewards", "advantages", "returns", "log_prob", "ratio", "pg_loss", "vf_loss", "kl_loss", "entropy", "loss",
)

# canonical key -> the keys it is computed from (at the same step)
UPSTREAM_OF = {
    "responses": ("prompts",),
    "rollout_log_prob": ("prompts", "responses"),
    "rewards": ("prompts", "responses"),
    "token_level_scores": ("prompts", "responses"),
    "values": ("prompts", "responses"),
    "old_log_prob": ("prompts", "responses"),
    "ref_log_prob": ("prompts", "responses"),
    "kl": ("old_log_prob", "ref_log_prob"),
    "token_level_rewards": ("token_level_scores", "kl"),
    "advantages": ("rewards", "token_level_scores", "values", "old_log_prob", "ref_log_prob", "kl",
                   "token_level_rewards"),
    "returns": ("rewards", "token_level_scores", "values"),
    "log_prob": ("prompts", "responses"),
    "ratio": ("log_prob", "old_log_prob"),
    "pg_loss": ("advantages", "ratio"),
    "vf_loss": ("values", "returns"),
    "kl_loss": ("log_prob", "ref_log_prob"),
    "entropy": ("log_prob",),
    "loss": ("pg_loss", "vf_loss", "kl_loss", "entropy"),
}


@functools.lru_cache(maxsize=None)
def computed_from(canonical_key: str) -> tuple[str, ...]:
    """Every key `canonical_key` is computed from, directly or through others (UPSTREAM_OF's closure):
    where an intermediate key was not captured, its own inputs stand for it."""
    found: list[str] = []
    todo = list(UPSTREAM_OF.get(canonical_key, ()))
    while todo:
        key = todo.pop(0)
        if key not in found and key != canonical_key:
            found.append(key)
            todo += UPSTREAM_OF.get(key, ())
    return tuple(found)
