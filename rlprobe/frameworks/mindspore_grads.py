"""Gradient monitoring of a MindSpore optimizer (pynative mode, CPU).

A forward pre-hook on the optimizer cell sees the gradient tuple it is called with, in the
order of `optimizer.parameters` (whose names are the parameter names). The statistics come
from the numpy kernel on a host snapshot: on the CPU that is the device. Graph mode
(`mindspore.jit`/GRAPH_MODE) runs no Python hooks and is refused with a ProbeError.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mindspore as ms

from rlprobe.lake.grad_stats import GradSpec, host_batch
from rlprobe.errors import ProbeError
from rlprobe.frameworks import get_adapter

if TYPE_CHECKING:
    from rlprobe.capture.grads import GradMonitor


def attach(monitor: "GradMonitor", optimizer: Any) -> Any:
    """Hook `optimizer`; returns the removable handle."""
    if ms.get_context("mode") != ms.PYNATIVE_MODE:
        raise ProbeError(f"monitor_grads(name={monitor.name!r}): MindSpore graph mode is not supported (no Python "
                         "hooks run inside a compiled graph); call mindspore.set_context(mode=mindspore.PYNATIVE_MODE)")
    params = list(optimizer.parameters)
    chosen = [i for i, p in enumerate(params) if monitor.selects(p.name)]
    if not chosen:
        raise ProbeError(f"monitor_grads(name={monitor.name!r}): no optimizer parameter matches "
                         f"params={monitor.patterns!r}; names look like {[p.name for p in params[:3]]!r}")
    adapter = get_adapter("mindspore")

    def hook(cell: Any, inputs: tuple[Any, ...]) -> None:
        step = monitor._next_step()
        if step is None:
            return
        grads = inputs[0] if inputs else ()
        if len(grads) != len(params):
            raise ProbeError(f"monitor_grads(name={monitor.name!r}) step {step}: the optimizer got {len(grads)} "
                             f"gradients for {len(params)} parameters; expected one per parameter")
        arrays, specs = [], []
        for i in chosen:
            g = grads[i]
            if g is None:
                continue
            arrays.append(g.asnumpy())
            specs.append(GradSpec(params[i].name, adapter.dtype_name(g), tuple(g.shape)))
        if not arrays:
            return
        # bf16 has no numpy dtype; asnumpy() refuses it, which raises above with MindSpore's message
        batch = host_batch(arrays, monitor.level, monitor.bounds)
        monitor.submit(step, specs, lambda: batch, sum(a.nbytes for a in arrays) // 8)

    return optimizer.register_forward_pre_hook(hook)
