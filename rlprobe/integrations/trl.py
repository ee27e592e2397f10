"""rlprobe for TRL in one line: `rlprobe.integrations.trl.attach(trainer, cfg)` (docs/trl.md).

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), ...)
    attach(trainer, "rlprobe.yaml")          # or attach(trainer, dump_path="./dump")
    trainer.train()                          # the dump is complete when train() returns

GRPOTrainer and RLOOTrainer (and online trainers sharing their code path): per optimizer step,
micro-batch and rank, the rollout (prompts, responses, masks, rewards per function and in
total, advantages, ref and rollout log-probs, sample and group ids) and the update
(old_log_prob, log_prob, entropies, loss); TRL's logged metrics as scalars at their step; the
trainer's arguments and model configs; gradients and parameter fingerprints once the optimizer
exists; module stages as the rlprobe_config switches them. RewardTrainer: chosen and rejected rewards and the loss.
With rlprobe_config.replay_from (GRPOTrainer), the generated completions and their rewards are the baseline's.
Nothing is installed on the trainer's class: the wrappers sit on this one trainer instance.
"""

from __future__ import annotations

import os
from typing import Any

from rlprobe.errors import ProbeError
from rlprobe.integrations.trl_guard import (
    ONLINE_ATTRIBUTES,
    ONLINE_KEYWORDS,
    ONLINE_METHODS,
    REWARD_METHODS,
    SUPPORTED_TRL,
    TESTED_TRL,
    check_methods,
    check_version,
    unsupported,
)

__all__ = ["attach", "TRLProbe", "SUPPORTED_TRL", "TESTED_TRL", "config_snapshot"]


class TRLProbe:
    """What `attach` returns: the probe (`.probe`) and the hooks on the trainer.

    The probe is closed and the hooks removed when `trainer.train()` ends; `close()` does it
    earlier (also as a context manager: `with attach(trainer, cfg): trainer.train()`)."""

    def __init__(self, trainer: Any, probe: Any, capture: Any):
        self.trainer, self.probe, self._capture = trainer, probe, capture

    @property
    def enabled(self) -> bool:
        return self._capture is not None

    def close(self) -> None:
        """Remove the hooks and close the probe (everything written; safe to call twice)."""
        if self._capture is not None:
            self._capture.detach()
            self._capture = None
            self.trainer.__dict__.pop("_rlprobe_trl", None)
        self.probe.close()

    def __enter__(self) -> "TRLProbe":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TRLProbe({type(self.trainer).__name__}, {self.probe!r})"


def attach(trainer: Any, config: Any = None, *, dump_path: str | os.PathLike[str] | None = None,
           grad_level: str = "L1", **probe_kwargs: Any) -> TRLProbe:
    """Capture a TRL trainer's key data, configs, metrics, gradients and module stages.

    `config`: what `rlprobe.from_config` takes (a dict or YAML file with an `rlprobe_config`
    section, or the section itself). Or `dump_path` alone: key data, configs, metrics and
    gradients into that folder. `grad_level`: the gradient monitor's level when gradients are
    switched on. `probe_kwargs` go to rlprobe.Probe (mode, start_step, stats_only, ...); rank
    and world size come from the trainer's accelerator."""
    import rlprobe
    from rlprobe.capture.config import parse_config

    if "_rlprobe_trl" in getattr(trainer, "__dict__", {}):
        raise ProbeError(f"rlprobe.integrations.trl: this {type(trainer).__name__} is already attached to "
                         f"{trainer.__dict__['_rlprobe_trl'].probe!r}; close() that one first")
    kind = trainer_kind(trainer)
    if config is None and dump_path is None:
        raise ProbeError("rlprobe.integrations.trl.attach(trainer, config): give a config with an rlprobe_config "
                         "section (dict, YAML file) or dump_path='./dump'")
    if config is not None and dump_path is not None:
        raise ProbeError("rlprobe.integrations.trl.attach(): give config or dump_path, not both (set dump_path "
                         "inside the config's rlprobe_config section)")
    if config is None:
        config = {"rlprobe_config": {"dump_path": os.fspath(dump_path), "key_data_dump": True,
                                     "configurations_dump": True, "metrics_dump": True, "grads_dump": True,
                                     "param_fingerprints": True}}
    replay_from = replay_source(trainer, config, probe_kwargs)
    accelerator = trainer.accelerator
    probe_kwargs.setdefault("rank", accelerator.process_index)
    probe_kwargs.setdefault("world_size", accelerator.num_processes)
    if parse_config(config).summed_keys is None:  # the config's summed_keys, else what the trainer says
        probe_kwargs.setdefault("summed_keys", summed_keys(trainer))
    probe = rlprobe.from_config(config, **probe_kwargs)
    if not getattr(probe, "enabled", True):  # nothing switched on: nothing installed, no files
        return TRLProbe(trainer, probe, None)
    from rlprobe.integrations.trl_capture import Capture

    capture = Capture(trainer, probe, kind, grad_level, lambda: config_snapshot(trainer), replay_from)
    try:
        capture.install()
    except BaseException:
        probe.close()
        raise
    handle = TRLProbe(trainer, probe, capture)
    trainer.__dict__["_rlprobe_trl"] = handle
    return handle


def replay_source(trainer: Any, config: Any, probe_kwargs: dict[str, Any]) -> str | None:
    """The baseline whose rollout the trainer consumes (replay_from), refused before a probe is made where the
    trainer has no rollout_func to replace its generation (RLOOTrainer, RewardTrainer)."""
    from rlprobe.capture.config import parse_config

    source = probe_kwargs.get("replay_from") or parse_config(config).replay_from
    if source is not None and not hasattr(trainer, "rollout_func"):
        raise ProbeError(f"rlprobe_config.replay_from={os.fspath(source)!r}: {type(trainer).__name__} has no "
                         "rollout_func, the hook through which a baseline's rollout replaces the generation; replay "
                         "supports GRPOTrainer")
    return None if source is None else os.fspath(source)


def trainer_kind(trainer: Any) -> str:
    """"online" (GRPO, RLOO and trainers sharing their code path) or "reward"; a ProbeError otherwise."""
    try:
        import trl
        from trl import GRPOTrainer, RewardTrainer, RLOOTrainer
    except ImportError as e:
        raise ProbeError(f"rlprobe.integrations.trl needs TRL {SUPPORTED_TRL}: pip install '.[trl]' in rlprobe's checkout ({e})") \
            from None
    del trl
    if isinstance(trainer, RewardTrainer):
        check_version()
        check_methods(trainer, REWARD_METHODS, attributes=("accelerator", "args", "state", "model"))
        return "reward"
    if isinstance(trainer, (GRPOTrainer, RLOOTrainer)) or all(callable(getattr(type(trainer), m, None))
                                                              for m in ONLINE_METHODS):
        check_version()
        check_methods(trainer, ONLINE_METHODS, ONLINE_KEYWORDS, ONLINE_ATTRIBUTES)
        return "online"
    raise unsupported(trainer, "is not a trainer the integration knows: it captures GRPOTrainer, RLOOTrainer (and "
                               "online trainers sharing their code path) and RewardTrainer")


def summed_keys(trainer: Any) -> list[str]:
    """The saved keys whose sum over a step's micro-batches is the step's value (Probe(summed_keys=)): the
    loss where the trainer's compute_loss already scales it for gradient accumulation (transformers'
    `loss_is_scaled_for_ga`: GRPOTrainer divides each micro-batch's loss by the accumulation steps;
    RLOOTrainer and RewardTrainer leave that to the Trainer, so their saved loss is the micro-batch's mean)."""
    return ["loss"] if getattr(trainer, "loss_is_scaled_for_ga", None) is True else []


def config_snapshot(trainer: Any) -> dict[str, Any]:
    """The trainer's full configuration for save_config: its arguments (GRPOConfig, RLOOConfig,
    RewardConfig) as a dict, the models' configs, dtypes and attention implementations, the
    reward functions and weights, and the library versions."""
    import accelerate
    import torch
    import transformers
    import trl

    import rlprobe

    unwrap = trainer.accelerator.unwrap_model
    models = {"policy": _model_info(unwrap(trainer.model))}
    ref = getattr(trainer, "ref_model", None)
    if ref is not None:
        models["reference"] = _model_info(unwrap(ref))
    snapshot: dict[str, Any] = {
        "trainer": type(trainer).__name__,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
                     "accelerate": accelerate.__version__, "rlprobe": rlprobe.__version__},
        "num_processes": trainer.accelerator.num_processes,
        "args": trainer.args.to_dict(),
        "models": models,
    }
    names = getattr(trainer, "reward_func_names", None)
    if names is not None:
        snapshot["reward_funcs"] = list(names)
        weights = getattr(trainer, "reward_weights", None)
        snapshot["reward_weights"] = None if weights is None else [float(w) for w in weights]
        for name, func in zip(names, getattr(trainer, "reward_funcs", [])):
            if isinstance(func, torch.nn.Module):
                models[f"reward/{name}"] = _model_info(func)
    return snapshot


def _model_info(model: Any) -> dict[str, Any]:
    dtypes = sorted({str(p.dtype) for p in model.parameters()}) if hasattr(model, "parameters") else []
    info: dict[str, Any] = {"class": type(model).__name__, "dtypes": dtypes,
                            "num_parameters": sum(p.numel() for p in model.parameters())
                            if hasattr(model, "parameters") else None}
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        info["attn_implementation"] = getattr(config, "_attn_implementation", None)
        info["config"] = config.to_dict()
    return info
