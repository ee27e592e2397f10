"""Gradient monitoring and parameter fingerprints of a MindSpore optimizer (pynative mode, CPU).

A forward pre-hook on the optimizer cell sees the gradient tuple it is called with, in the
order of `optimizer.parameters` (whose names are the parameter names); a forward hook runs once
the cell has updated them. The statistics come from the numpy kernel on a host snapshot: on the
CPU that is the device. Graph mode (`mindspore.jit`/GRAPH_MODE) runs no Python hooks and is
refused with a ProbeError.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import mindspore as ms

from rlprobe.errors import ProbeError
from rlprobe.frameworks.base import GradFinish, OptimizerHooks, OptimizerStep, ParamFilter, StepCallback
from rlprobe.lake.grad_stats import host_batch
from rlprobe.lake.grad_stats import ParamBatch, host_fingerprints


class MindSporeOptimizerHooks(OptimizerHooks):
    def __init__(self, optimizer: Any, select: ParamFilter, where: str, before_step: StepCallback,
                 after_step: StepCallback | None):
        if ms.get_context("mode") != ms.PYNATIVE_MODE:
            raise ProbeError(f"{where}: MindSpore graph mode is not supported (no Python hooks run inside a "
                             "compiled graph); call mindspore.set_context(mode=mindspore.PYNATIVE_MODE)")
        params = list(optimizer.parameters)
        chosen = [i for i, p in enumerate(params) if select(p.name)]
        if not chosen:
            raise ProbeError(f"{where}: no optimizer parameter matches "
                             f"params={select.patterns!r}; names look like {[p.name for p in params[:3]]!r}")
        self.optimizer = optimizer

        def pre(cell: Any, inputs: tuple[Any, ...]) -> None:
            def grads() -> list[tuple[str, Any]]:
                found = inputs[0] if inputs else ()
                if len(found) != len(params):
                    raise ProbeError(f"the optimizer got {len(found)} gradients for {len(params)} parameters; "
                                     "expected one per parameter")
                return [(params[i].name, found[i]) for i in chosen if found[i] is not None]

            before_step(OptimizerStep(grads, named_params))

        def post(cell: Any, inputs: tuple[Any, ...], output: Any) -> None:
            after_step(OptimizerStep(lambda: [], named_params))  # type: ignore[misc]

        def named_params() -> list[tuple[str, Any]]:
            return [(params[i].name, params[i]) for i in chosen]

        self._handles = [optimizer.register_forward_pre_hook(pre)]
        if after_step is not None:
            self._handles.append(optimizer.register_forward_hook(post))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def host_grad_stats(grads: Sequence[Any], level: str, bounds: Sequence[float]) -> tuple[GradFinish, int]:
    """The numpy kernel on host copies, computed now (the copies are the expensive part on the CPU)."""
    # bf16 has no numpy dtype; asnumpy() refuses it, which raises with MindSpore's message
    arrays = [g.asnumpy() for g in grads]
    batch = host_batch(arrays, level, bounds)
    return (lambda: batch), sum(a.nbytes for a in arrays) // 8


def host_param_fingerprints(params: Sequence[Any]) -> tuple[Callable[[], ParamBatch], int]:
    """The numpy reference on host copies of the updated parameters (on the CPU, the device)."""
    arrays = [p.asnumpy() for p in params]
    batch = host_fingerprints(arrays)
    return (lambda: batch), 24 * len(arrays)
