"""The TRL integration's capture: a TrainerCallback for the step rhythm and wrappers of one
trainer's methods for the tensors (docs/trl.md).

Per optimizer step S (TRL's `state.global_step` when the step begins) the probe receives:

- the rollout, once per generation, in generation order: prompts, prompt_mask, responses,
  response_mask, rewards (the weighted total) and `rewards/<function>`, advantages,
  ref_log_prob, rollout_log_prob (None where TRL has none), with save(sample_ids=, group_ids=);
- the update, once per micro-batch, in the order TRL shuffled them: old_log_prob (None where TRL
  did not compute it), log_prob, entropies, loss, with save(sample_ids=) (the rows' own ids).

Module stages follow the probe's rlprobe_config: `rollout_generate` (generation),
`actor_compute_log_prob` (old log-probs), `reference_compute_log_prob`, `reward_compute`
(reward models that are modules) and `actor_update` (the loss forward and its backward).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from transformers import TrainerCallback

from rlprobe.errors import ProbeError
from rlprobe.integrations.trl_guard import patch, unsupported

SAMPLE_IDS = "_rlprobe_sample_ids"  # travels with TRL's batch through its shuffle and split
OLD_LOG_PROB = "_rlprobe_old_log_prob"  # per-token old log-probs where TRL keeps only sums (RLOO)


def save_rows(probe: Any, data: dict[str, Any], sample_ids: Any, group_ids: Any = None) -> None:
    """One save call whose batch rows carry their sample (and GRPO group) ids: the dump's `sample`
    rows (docs/dump-format.md), which align the rollout with TRL's shuffled micro-batches."""
    probe.save(data, sample_ids=_on_host(sample_ids), group_ids=None if group_ids is None else _on_host(group_ids))


def _on_host(ids: torch.Tensor) -> torch.Tensor:
    """The ids on the host: as they are when they already are (each torch call gives up the GIL, which
    beside a busy writer thread can cost a switch interval)."""
    return ids if ids.is_cpu and not ids.requires_grad else ids.detach().cpu()


class StepCallback(TrainerCallback):
    """The step rhythm: configs, gradients, scalars and `probe.step()` at TRL's optimizer steps."""

    def __init__(self, capture: "Capture"):
        self.capture = capture

    def on_train_begin(self, args, state, control, **kwargs):
        self.capture.train_begin(state)

    def on_step_begin(self, args, state, control, **kwargs):
        self.capture.check_step(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        # after optimizer.step(): the step's rows are complete; TRL has already counted it
        self.capture.probe.step()

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.capture.log(logs or {}, state)

    def on_train_end(self, args, state, control, **kwargs):
        self.capture.train_end()


class Capture:
    """Everything the integration installed on one trainer; `detach()` removes it."""

    def __init__(self, trainer: Any, probe: Any, kind: str, grad_level: str | None, snapshot: Callable[[], dict],
                 replay_from: str | None = None):
        self.trainer, self.probe, self.kind = trainer, probe, kind
        self.replay_from = replay_from  # the baseline whose rollout the trainer consumes (trl_replay.py)
        self.grad_level = grad_level
        self._snapshot = snapshot
        self._patches: list[Any] = []  # Patch, and ReplayHooks with replay_from: each has remove()
        self._callback: StepCallback | None = None
        self._stage: Any = None  # the open actor_update stage
        self._in_training_step = False
        self._phase: str | None = None  # "rollout" | "update" while TRL computes them
        self._calls: list[tuple[str, Any, Any]] = []  # (role, log-probs, entropies) in the current phase
        self._rewards: Any = None
        self._generations = 0
        self._step_checked = False
        self._unwrapped: dict[int, tuple[Any, Any]] = {}  # id(model) -> (model, accelerate's unwrapped model)

    # -- installing ------------------------------------------------------------------------
    def install(self) -> None:
        try:
            if self.kind == "online":
                for name, make in (("_generate_and_score_completions", self._wrap_rollout),
                                   ("_generate", self._wrap_generate),
                                   ("_calculate_rewards", self._wrap_rewards),
                                   ("_get_per_token_logps_and_entropies", self._wrap_logps),
                                   ("_prepare_inputs", self._wrap_prepare_inputs),
                                   ("compute_loss", self._wrap_online_loss),
                                   ("training_step", self._wrap_training_step)):
                    self._patches.append(patch(self.trainer, name, make))
            else:
                for name, make in (("compute_loss", self._wrap_reward_loss),
                                   ("_prepare_inputs", self._wrap_prepare_inputs),
                                   ("training_step", self._wrap_training_step)):
                    self._patches.append(patch(self.trainer, name, make))
            if self.replay_from is not None:
                from rlprobe.integrations.trl_replay import ReplayHooks

                self._patches.append(ReplayHooks(self.trainer, self.probe, self.replay_from))
            self._callback = StepCallback(self)
            self.trainer.add_callback(self._callback)
        except BaseException:
            self.detach()
            raise

    def detach(self) -> None:
        """Remove the wrappers and the callback (the probe stays open; see TRLProbe.close)."""
        self._close_stage()
        for p in reversed(self._patches):
            p.remove()
        self._patches.clear()
        self._unwrapped.clear()
        if self._callback is not None:
            self.trainer.remove_callback(self._callback)
            self._callback = None
        self.trainer.__dict__.pop("_rlprobe_trl", None)

    # -- the step rhythm -----------------------------------------------------------------------
    def train_begin(self, state: Any) -> None:
        self.check_step(state.global_step)
        self.probe.save_config(self._snapshot())
        optimizer = getattr(self.trainer.optimizer, "optimizer", self.trainer.optimizer)  # accelerate's wrapper
        name = "reward_model" if self.kind == "reward" else "actor"
        if self.grad_level is not None:
            self.probe.monitor_grads(self._unwrap(self.trainer.model), optimizer=optimizer, name=name,
                                     level=self.grad_level)
        # a no-op unless rlprobe_config switches param_fingerprints on
        self.probe.monitor_params(self._unwrap(self.trainer.model), optimizer=optimizer, name=name)

    def check_step(self, global_step: int) -> None:
        if self._step_checked:
            return
        self._step_checked = True
        if self.probe.current_step != global_step:
            raise ProbeError(
                f"rlprobe.integrations.trl: TRL is at global step {global_step} (resumed from a checkpoint?) but the "
                f"probe on {getattr(self.probe, 'path', '?')} is at step {self.probe.current_step}; pass "
                f"start_step={global_step} to attach() (and mode='append' to add to an earlier dump of this run), "
                "so that the probe's steps are TRL's")

    def log(self, logs: dict[str, Any], state: Any) -> None:
        values = {k: float(v) for k, v in logs.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if values:
            # TRL logs after the optimizer step has been counted: the values belong to the step before
            self.probe.log_metrics(values, step=max(state.global_step - 1, 0))

    def train_end(self) -> None:
        self.detach()
        self.probe.close()

    # -- helpers ----------------------------------------------------------------------------------
    def _unwrap(self, model: Any) -> Any:
        """accelerate's unwrap_model, once per model object: it costs ~0.1 ms a call (environment
        flags, compiled-region checks) and the wrappers ask for it several times a step."""
        seen = self._unwrapped.get(id(model))
        if seen is None or seen[0] is not model:
            seen = self._unwrapped[id(model)] = (model, self.trainer.accelerator.unwrap_model(model))
        return seen[1]

    def _training(self) -> bool:
        return bool(self.trainer.model.training)

    def _close_stage(self) -> None:
        stage, self._stage = self._stage, None
        if stage is not None:
            stage.__exit__(None, None, None)

    # -- wrappers shared by both kinds -----------------------------------------------------------
    def _wrap_training_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def training_step(*args: Any, **kwargs: Any) -> Any:
            self._in_training_step = True
            try:
                return original(*args, **kwargs)
            finally:
                self._in_training_step = False
                self._close_stage()  # the update stage ends after backward

        return training_step

    def _wrap_prepare_inputs(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def prepare_inputs(*args: Any, **kwargs: Any) -> Any:
            inputs = original(*args, **kwargs)
            if self._in_training_step and self._stage is None:
                # from here to the end of training_step: the loss forward and its backward
                name = "reward_update" if self.kind == "reward" else "actor_update"
                stage = self.probe.stage(name, model=self._unwrap(self.trainer.model))
                stage.__enter__()
                self._stage = stage
            return inputs

        return prepare_inputs

    # -- GRPO / RLOO: the rollout --------------------------------------------------------------------
    def _wrap_rollout(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def generate_and_score(inputs: Any) -> Any:
            if not self._training():  # evaluation rollouts are not training data
                return original(inputs)
            self._phase, self._calls, self._rewards = "rollout", [], None
            try:
                output = original(inputs)
            finally:
                self._phase = None
            self._save_rollout(output)
            return output

        return generate_and_score

    def _wrap_generate(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def generate(prompts: Any) -> Any:
            if self._phase != "rollout":
                return original(prompts)
            with self.probe.stage("rollout_generate", model=self._unwrap(self.trainer.model)):
                return original(prompts)

        return generate

    def _wrap_rewards(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def calculate_rewards(inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
            if self._phase != "rollout":
                return original(inputs, prompts, completions, completion_ids_list)
            modules = {name: f for name, f in zip(self.trainer.reward_func_names, self.trainer.reward_funcs)
                       if isinstance(f, torch.nn.Module)}
            stage = self.probe.stage("reward_compute", model=modules) if modules else contextlib.nullcontext()
            with stage:
                rewards = original(inputs, prompts, completions, completion_ids_list)
            self._rewards = rewards
            return rewards

        return calculate_rewards

    def _wrap_logps(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def per_token_logps(*args: Any, **kwargs: Any) -> Any:
            if self._phase is None:
                return original(*args, **kwargs)
            model = args[0] if args else kwargs.get("model")
            role = "update"
            if self._phase == "rollout":
                ref = self.trainer.ref_model
                role = "reference" if ref is not None and self._unwrap(model) is self._unwrap(ref) else "actor"
            stage = {"reference": "reference_compute_log_prob", "actor": "actor_compute_log_prob"}.get(role)
            with self.probe.stage(stage, model=self._unwrap(model)) if stage else contextlib.nullcontext():
                result = original(*args, **kwargs)
            if not (isinstance(result, tuple) and len(result) == 3 and isinstance(result[0], torch.Tensor)):
                raise unsupported(self.trainer, "returned something other than (log-probs, entropies, aux loss) "
                                                "from _get_per_token_logps_and_entropies()")
            self._calls.append((role, result[0], result[1]))
            return result

        return per_token_logps

    def _save_rollout(self, output: Any) -> None:
        trainer = self.trainer
        need = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")
        missing = [k for k in need if not isinstance(output, dict) or not isinstance(output.get(k), torch.Tensor)]
        if missing:
            raise unsupported(trainer, f"returned a batch without {', '.join(missing)} from "
                                       "_generate_and_score_completions()")
        if self._rewards is None:
            raise unsupported(trainer, "computed the rollout's rewards without _calculate_rewards()")
        n = output["completion_ids"].shape[0]
        process, processes = trainer.accelerator.process_index, trainer.accelerator.num_processes
        rewards_per_func = self._rewards[process * n:(process + 1) * n]  # TRL gathers every process's rewards
        weights = trainer.reward_weights.to(rewards_per_func.device)
        total = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)  # TRL's weighted total
        total[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # unscorable rows, as TRL marks them
        actor = [logps for role, logps, _ in self._calls if role == "actor"]
        reference = [logps for role, logps, _ in self._calls if role == "reference"]
        old = output.get("old_per_token_logps")
        if old is None and actor:  # RLOO keeps only per-sequence sums in the batch
            output[OLD_LOG_PROB] = old = actor[0]
        ref = output.get("ref_per_token_logps")
        if ref is None and reference:
            ref = reference[0]
        base = self._generations * n * processes + process * n
        self._generations += 1
        sample_ids = torch.arange(base, base + n, dtype=torch.int64, device=output["completion_ids"].device)
        output[SAMPLE_IDS] = sample_ids
        mask = output["completion_mask"]
        data = {"prompts": output["prompt_ids"], "prompt_mask": output["prompt_mask"],
                "responses": output["completion_ids"], "response_mask": mask,
                "rewards": total, "advantages": output["advantages"], "ref_log_prob": ref,
                "rollout_log_prob": output.get("sampling_per_token_logps")}
        if "tool_mask" in output:
            data["tool_mask"] = output["tool_mask"]
        for i, name in enumerate(trainer.reward_func_names):
            data[f"rewards/{name}"] = rewards_per_func[:, i]
        save_rows(self.probe, data, sample_ids, sample_ids // trainer.num_generations)

    # -- GRPO / RLOO: the update ---------------------------------------------------------------------
    def _wrap_online_loss(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def compute_loss(model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
            if not self._training() or not isinstance(inputs, dict) or SAMPLE_IDS not in inputs:
                return original(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
            self._phase, self._calls = "update", []
            try:
                loss = original(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
            finally:
                self._phase = None
            if len(self._calls) != 1:
                raise unsupported(self.trainer, f"called _get_per_token_logps_and_entropies() {len(self._calls)} "
                                                "times in compute_loss() where the integration expects once")
            _, log_prob, entropies = self._calls[0]
            self._calls = []
            old = inputs.get("old_per_token_logps")
            if old is None:
                old = inputs.get(OLD_LOG_PROB)
            value = loss[0] if isinstance(loss, tuple) else loss
            save_rows(self.probe, {"old_log_prob": old, "log_prob": log_prob, "entropies": entropies,
                                   "loss": value.detach()}, inputs[SAMPLE_IDS])
            return loss

        return compute_loss

    # -- RewardTrainer ------------------------------------------------------------------------------
    def _wrap_reward_loss(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def compute_loss(model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None) -> Any:
            if not self._training():
                return original(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
            result = original(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
            if not (isinstance(result, tuple) and len(result) == 2 and hasattr(result[1], "logits")):
                raise unsupported(self.trainer, "returned something other than (loss, outputs with logits) from "
                                                "compute_loss(return_outputs=True)")
            loss, outputs = result
            # RewardTrainer's batch is the chosen sequences followed by the rejected ones
            chosen, rejected = torch.chunk(outputs.logits.detach().squeeze(-1), chunks=2)
            self.probe.save({"input_ids": inputs["input_ids"], "rewards_chosen": chosen, "rewards_rejected": rejected,
                             "loss": loss.detach()})
            return result if return_outputs else loss

        return compute_loss
