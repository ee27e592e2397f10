"""The adapter of tests/frameworks/tinyframe.py: everything rlprobe needs to capture key data,
module dumps and gradient statistics of a framework it has never heard of, in one file."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tinyframe

from rlprobe.errors import ProbeError
from rlprobe.frameworks.base import (
    Adapter, GradFinish, Handle, OptimizerHooks, OptimizerStep, ParamFilter, StagedLeaf, StepCallback,
)
from rlprobe.lake.grad_stats import host_batch


def _array(t: tinyframe.Tensor) -> np.ndarray:
    return np.array(t.values, np.float64).reshape(t.shape)


class TinyAdapter(Adapter):
    name = "tiny"
    module_kinds = "tinyframe.Module"
    optimizer_kinds = "a tinyframe.SGD"

    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, tinyframe.Tensor)

    def dtype_name(self, value: Any) -> str:
        return "float64"

    def stage(self, values: Sequence[Any], keep_raw: bool) -> list[StagedLeaf]:
        arrays = [_array(t) for t in values]  # a copy: later changes to t.values do not reach it
        return [StagedLeaf("float64", a.shape, a, nbytes=a.nbytes) for a in arrays]

    def owns_module(self, module: Any) -> bool:
        return isinstance(module, tinyframe.Module)

    def submodules(self, module: Any) -> Iterator[tuple[str, Any]]:
        return module.named_modules()

    def hook_module(self, module: Any, pre: Callable, post: Callable, backward: Callable | None) -> list[Handle]:
        if backward is not None:
            raise ProbeError("tinyframe has no backward pass; use backward=False")
        return [module.pre_hooks.add(pre), module.post_hooks.add(post)]

    def owns_optimizer(self, model: Any, optimizer: Any) -> bool:
        return isinstance(optimizer, tinyframe.SGD)

    def hook_optimizer(self, model: Any, optimizer: Any, select: ParamFilter, where: str,
                       before_step: StepCallback, after_step: StepCallback | None = None) -> OptimizerHooks:
        return TinyOptimizerHooks(model, optimizer, select, before_step, after_step)

    def grad_stats(self, grads: Sequence[Any], level: str, bounds: Sequence[float],
                   state: dict[str, Any]) -> tuple[GradFinish, int]:
        batch = host_batch([_array(g) for g in grads], level, bounds)
        return (lambda: batch), 0


class TinyOptimizerHooks(OptimizerHooks):
    def __init__(self, model: Any, optimizer: Any, select: ParamFilter, before_step: StepCallback,
                 after_step: StepCallback | None):
        self.optimizer = optimizer
        named = [(n, p) for n, p in model.parameters() if select(n)]
        at = OptimizerStep(lambda: [(n, p.grad) for n, p in named if p.grad is not None], lambda: list(named))
        self.handles = [optimizer.pre_hooks.add(lambda opt: before_step(at))]
        if after_step is not None:
            self.handles.append(optimizer.post_hooks.add(lambda opt: after_step(at)))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
