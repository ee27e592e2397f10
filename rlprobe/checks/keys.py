"""The loss names and config leaves the checks read. Trainers' key names and their canonical keys
(column `canonical` of the `stats` table) are rlprobe/key_names.csv, the one table capture, check
and compare read (rlprobe.key_names)."""

from __future__ import annotations

# keys and scalars that are a loss: the finite-loss check reads them (besides any name ending in "loss")
LOSS_NAMES = ("loss", "pg_loss", "vf_loss", "policy_loss", "value_loss", "actor/pg_loss", "critic/vf_loss")

# config leaves (the last path component) that the checks read; docs/check.md lists them
CLIP_CONFIG = ("clip_ratio", "cliprange", "clip_range", "clip_eps", "epsilon", "clip")
GROUP_SIZE_CONFIG = ("num_generations", "group_size", "n_samples_per_prompt")
REF_FROM_ACTOR_CONFIG = ("ref_starts_as_actor",)

