"""Hooks on the torch optimizer that steps a model's parameters (what `monitor_grads` needs).

Given the optimizer, its own pre-step hook is installed at once. Given only the model, a global
pre-step hook waits for the first optimizer that steps one of its parameters, hooks that one
and removes itself: so the step is the count of that optimizer's own `step()` calls (a critic
optimizer in the same process never advances an actor's count), and a step a grad scaler skips
(it does not call `optimizer.step()`) is not counted.
"""

from __future__ import annotations

from typing import Any

import torch

from rlprobe.errors import ProbeError
from rlprobe.frameworks.base import OptimizerHooks, OptimizerStep, ParamFilter, StepCallback


def is_torch_training(model: Any, optimizer: Any) -> bool:
    return any(isinstance(x, (torch.nn.Module, torch.optim.Optimizer)) for x in (model, optimizer) if x is not None)


class TorchOptimizerHooks(OptimizerHooks):
    def __init__(self, model: Any, optimizer: Any, select: ParamFilter, where: str, before_step: StepCallback,
                 after_step: StepCallback | None):
        self.where = where
        self.before_step, self.after_step = before_step, after_step
        self.optimizer = None
        self._handles: list[Any] = []
        self._global: Any = None
        self._removed = False
        self._named = self._selected(model, optimizer, select)
        self._step = OptimizerStep(self._grads, lambda: list(self._named))
        if optimizer is not None:
            self._attach(optimizer)
        else:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            self._global = register_optimizer_step_pre_hook(self._discover)
            self._handles.append(self._global)

    def _selected(self, model: Any, optimizer: Any, select: ParamFilter) -> list[tuple[str, Any]]:
        if model is not None:
            named = list(model.named_parameters())
        else:
            named = []
            for g, group in enumerate(optimizer.param_groups):
                names = group.get("param_names") or [f"param_groups.{g}.{i}" for i in range(len(group["params"]))]
                named.extend(zip(names, group["params"]))
        chosen = [(n, p) for n, p in named if p.requires_grad and select(n)]
        if not chosen:
            raise ProbeError(f"{self.where}: no trainable parameter matches params={select.patterns!r}; "
                             f"names look like {[n for n, _ in named[:3]]!r}")
        return chosen

    def _discover(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Global pre-step hook, only until the optimizer that steps these parameters is found."""
        if self.optimizer is not None or self._removed:
            return
        ours = {id(p) for _, p in self._named}
        if any(id(p) in ours for group in optimizer.param_groups for p in group["params"]):
            # its own hooks run after the global ones, so the hook added now counts this very step
            self._attach(optimizer)

    def _attach(self, optimizer: Any) -> None:
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        named = [(n, p) for n, p in self._named if id(p) in stepped]
        if not named:
            raise ProbeError(f"{self.where}: the optimizer steps none of the monitored "
                             "parameters; pass the optimizer of this model")
        self._named = named
        self.optimizer = optimizer
        self._handles.append(optimizer.register_step_pre_hook(self._pre_step))
        if self.after_step is not None:
            self._handles.append(optimizer.register_step_post_hook(self._post_step))

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._global is not None:  # safe now: the global hooks have finished running
            self._global.remove()
            self._global = None
        self.before_step(self._step)

    def _post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.after_step(self._step)  # type: ignore[misc]

    def _grads(self) -> list[tuple[str, Any]]:
        found = []
        for name, p in self._named:
            g = getattr(p, "main_grad", None)  # Megatron keeps the fp32 gradient here
            g = p.grad if g is None else g
            if g is not None:  # no gradient this step (unused in the forward): no row
                found.append((name, g))
        return found

    def remove(self) -> None:
        self._removed = True
        for h in self._handles:
            h.remove()
        self._handles.clear()
