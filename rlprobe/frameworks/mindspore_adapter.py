"""MindSpore tensors (CPU, pynative). Statistics come from a host snapshot on the writer thread.

Gradient monitoring and parameter fingerprints of a MindSpore optimizer (MindSporeOptimizerHooks): a forward
pre-hook on the optimizer cell sees the gradient tuple it is called with, in the order of
`optimizer.parameters` (whose names are the parameter names); a forward hook runs once the cell has updated
them. The statistics come from the numpy kernel on a host snapshot: on the CPU that is the device. Graph mode
(`mindspore.jit`/GRAPH_MODE) runs no Python hooks and is refused with a ProbeError."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Sequence

import mindspore as ms
import numpy as np

from rlprobe.errors import ProbeError
from rlprobe.frameworks.base import (Adapter, GradFinish, Handle, OptimizerHooks, OptimizerStep, ParamFilter,
                                     StagedLeaf, StepCallback)
from rlprobe.lake.encoding import SUPPORTED
from rlprobe.lake.grad_stats import ParamBatch, host_batch, host_fingerprints

_NAMES = {
    "Bool": "bool", "Int8": "int8", "Int16": "int16", "Int32": "int32", "Int64": "int64",
    "UInt8": "uint8", "UInt16": "uint16", "UInt32": "uint32", "UInt64": "uint64",
    "Float16": "float16", "BFloat16": "bfloat16", "Float32": "float32", "Float64": "float64",
}


def _dtype_name(t: Any) -> str:
    name = _NAMES.get(str(t.dtype))
    if name is None:
        raise ProbeError(f"unsupported MindSpore dtype {t.dtype}; supported: {', '.join(SUPPORTED)}")
    return name


class MindSporeAdapter(Adapter):
    name = "mindspore"
    module_kinds = "mindspore.nn.Cell"
    optimizer_kinds = "a MindSpore optimizer"

    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, ms.Tensor)

    def dtype_name(self, value: Any) -> str:
        return _dtype_name(value)

    def stage(self, values: Sequence[Any], keep_raw: bool) -> list[StagedLeaf]:
        leaves = []
        for t in values:
            dtype = _dtype_name(t)
            if dtype == "bfloat16":
                # numpy has no bfloat16: widen exactly, then keep the top 16 bits as the raw bytes
                # asarray keeps 0-d (ascontiguousarray makes it 1-d)
                wide = np.asarray(t.astype(ms.float32).asnumpy(), order="C")
                raw = (wide.view(np.uint32) >> 16).astype(np.uint16)
            else:
                raw = np.array(t.asnumpy(), copy=True, order="C")
            leaves.append(StagedLeaf(dtype, tuple(raw.shape), raw, nbytes=raw.nbytes))
        return leaves

    def from_host(self, array: np.ndarray, dtype: str, like: Any) -> Any:
        want = getattr(ms, dtype, None) if dtype in _NAMES.values() else None
        if want is None:
            raise ProbeError(f"MindSpore on this host has no {dtype} tensor to replay the baseline's into "
                             f"(the dtypes it takes: {', '.join(sorted(set(_NAMES.values())))})")
        # a copy: the lake's array may be a read-only view of its file; bfloat16 arrives widened to float32
        # (exactly), so the cast back is exact. MindSpore places tensors by its context: like's device.
        out = ms.Tensor(np.array(array, copy=True, order="C"))
        return out if out.dtype == want else out.astype(want)

    def rank_and_world(self) -> tuple[int, int] | None:
        return mindspore_rank_and_world()

    # -- module hooks (PyNative mode) ------------------------------------------------------------
    def owns_module(self, module: Any) -> bool:
        return isinstance(module, ms.nn.Cell)

    def check_module_hooks(self, backward: bool) -> None:
        if ms.get_context("mode") != ms.PYNATIVE_MODE:
            raise ProbeError("module dumps of MindSpore Cells need PyNative mode (hooks do not run in graph mode); "
                             "call mindspore.set_context(mode=mindspore.PYNATIVE_MODE) or dump key data instead")
        if not hasattr(ms.nn.Cell, "register_forward_pre_hook"):
            raise ProbeError(f"this MindSpore ({ms.__version__}) has no Cell.register_forward_pre_hook; "
                             "module dumps need MindSpore 2.3 or newer")

    def submodules(self, module: Any) -> Iterator[tuple[str, Any]]:
        return module.cells_and_names()

    def own_parameters(self, module: Any) -> list[tuple[str, Any]]:
        # a Cell's own Parameters (expand=False); their names are full paths: keep the last part
        return [(name.rsplit(".", 1)[-1], p) for name, p in module.parameters_and_names(expand=False)]

    def hook_module(self, module: Any, pre: Callable, post: Callable, backward: Callable | None) -> list[Handle]:
        handles = [module.register_forward_pre_hook(pre, with_kwargs=True), module.register_forward_hook(post)]
        if backward is not None:
            handles.append(module.register_backward_hook(backward))
        return handles

    # -- optimizer hooks and gradient statistics ---------------------------------------------------
    def owns_optimizer(self, model: Any, optimizer: Any) -> bool:
        # an optimizer is a Cell: msprobe's MindSpore debugger takes it as `model`, so that works too
        return isinstance(optimizer, ms.nn.Optimizer) or (optimizer is None and isinstance(model, ms.nn.Optimizer))

    def hook_optimizer(self, model: Any, optimizer: Any, select: ParamFilter, where: str,
                       before_step: StepCallback, after_step: StepCallback | None = None) -> OptimizerHooks:
        return MindSporeOptimizerHooks(optimizer if optimizer is not None else model, select, where,
                                       before_step, after_step)

    def grad_stats(self, grads: Sequence[Any], level: str, bounds: Sequence[float], state: dict[str, Any]):
        return host_grad_stats(grads, level, bounds)

    def param_fingerprints(self, params: Sequence[Any], background: bool = True):  # computed now either way
        return host_param_fingerprints(params)


def mindspore_rank_and_world() -> tuple[int, int] | None:
    try:
        from mindspore import communication as comm

        if os.environ.get("MS_ROLE") or os.environ.get("RANK_TABLE_FILE") or os.environ.get("MS_WORKER_NUM"):
            return comm.get_rank(), comm.get_group_size()
    except Exception:  # communication not initialised: not a distributed MindSpore job
        return None
    return None


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
