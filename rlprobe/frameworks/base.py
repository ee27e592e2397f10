"""The one interface every framework answers (docs/modules.md, "Adding a framework").

Capture code (rlprobe.capture) asks these questions and never names a framework: is this a
tensor, what dtype, a snapshot of these tensors, which rank, rank 0's value on every rank, hook
this module, hook this optimizer's step, gradient statistics and parameter fingerprints. An adapter
subclasses `Adapter`, answers what its framework can (the defaults say "not supported"), and is
registered by one line in `rlprobe.frameworks.ADAPTERS`. The simplest, NumpyAdapter (numpy arrays, numpy
scalars and Python bool/int/float), is here too.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from rlprobe.errors import ProbeError
from rlprobe.lake.encoding import SUPPORTED, WIDENED_FLOATS
from rlprobe.lake.grad_stats import GradBatch, ParamBatch

@dataclass
class StagedLeaf:
    """One tensor on its way to the writer.

    `raw` holds the original bytes in a storage dtype (see lake.encoding), or is None in
    stats-only mode when the tensor never left its device. `device_stats` is filled when the
    statistics were computed on the device; the writer computes them on the host otherwise.
    `finish` (if set) blocks until asynchronous device-to-host copies have landed and then
    fills `raw` and `device_stats`; the writer calls it before touching either.
    """

    dtype: str
    shape: tuple[int, ...]
    raw: np.ndarray | None
    device_stats: dict[str, float | int | None] | None = None
    finish: Callable[[], None] | None = None
    release: Callable[[], None] | None = None  # the writer calls it when done with `raw`
    nbytes: int = 0


@dataclass
class ParamFilter:
    """Which parameters a gradient monitor watches: fnmatch patterns, none = every parameter."""

    patterns: list[str]

    def __call__(self, name: str) -> bool:
        return not self.patterns or any(fnmatch.fnmatchcase(name, p) for p in self.patterns)


@dataclass
class OptimizerStep:
    """What an optimizer hook hands its callbacks at one step of the hooked optimizer. Both are
    functions, so a step that is not captured costs nothing: `grads()` gives (name, gradient) of
    the selected parameters that have a gradient this step, `params()` (name, parameter) of all
    the selected parameters."""

    grads: Callable[[], list[tuple[str, Any]]]
    params: Callable[[], list[tuple[str, Any]]]


StepCallback = Callable[[OptimizerStep], None]
# runs on the writer thread: waits for the device work `grad_stats` queued, returns the host batch
GradFinish = Callable[[], GradBatch]


class Handle:
    """A removable hook (as torch's RemovableHandle): `remove()` undoes what was installed."""

    def remove(self) -> None:
        raise NotImplementedError


class OptimizerHooks(Handle):
    """The hooks one gradient monitor installed; `optimizer` is the hooked optimizer (None while an
    adapter is still looking for the one that steps the model's parameters)."""

    optimizer: Any = None


class Adapter:
    """One framework's answers. `name` is what rows record in their `framework` column;
    `module_kinds` / `optimizer_kinds` name, in error messages, what `stage(model=)` and
    `monitor_grads()` accept from this framework (empty: not supported)."""

    name: str = ""
    module_kinds: str = ""
    optimizer_kinds: str = ""

    # -- key data (probe.save) ---------------------------------------------------------------
    def is_tensor(self, value: Any) -> bool:
        """Whether `value` is this framework's tensor: a question of its type alone (frameworks.adapter_for
        remembers the answer per type)."""
        raise NotImplementedError

    def dtype_name(self, value: Any) -> str:
        """The lake.encoding dtype name; ProbeError (naming the supported ones) when unsupported."""
        raise NotImplementedError

    def stage(self, values: Sequence[Any], keep_raw: bool) -> list[StagedLeaf]:
        """Snapshot `values` (one save call) so later in-place changes cannot alter what is saved."""
        raise NotImplementedError

    def from_host(self, array: np.ndarray, dtype: str, like: Any) -> Any:
        """`array` (a lake tensor as `Dump.tensor` reads it: float32 for widened floats) as this framework's
        value of the lake dtype `dtype`, of `like`'s type and on its device (probe.replay, docs/replay.md)."""
        raise ProbeError(f"replaying a baseline's tensors into {self.name or type(self).__name__} values is not "
                         "supported; pass torch tensors or numpy arrays to probe.replay()")

    # -- processes ---------------------------------------------------------------------------
    def prepare(self) -> None:
        """Called when a probe that may see this framework's tensors is created (warm buffers up)."""

    def rank_and_world(self) -> tuple[int, int] | None:
        """(rank, world size) when this framework's collective communication is set up, else None."""
        return None

    def broadcast_from_rank0(self, value: str) -> str | None:
        """Rank 0's `value` on every rank, through this framework's communication; None when it
        has none set up (then another adapter, or nobody, agrees the value)."""
        return None

    # -- module hooks (probe.stage) ----------------------------------------------------------
    def owns_module(self, module: Any) -> bool:
        return False

    def check_module_hooks(self, backward: bool) -> None:
        """Raise ProbeError when module hooks cannot run now (a graph mode, an old version)."""

    def submodules(self, module: Any) -> Iterator[tuple[str, Any]]:
        """(qualified name, submodule) of `module` and everything inside it, itself first ("")."""
        raise NotImplementedError

    def own_parameters(self, module: Any) -> list[tuple[str, Any]]:
        """(own name, parameter) of `module` itself, not of its children (the weights at a module dump)."""
        return []

    def hook_module(self, module: Any, pre: Callable, post: Callable, backward: Callable | None) -> list[Handle]:
        """Install `pre(module, args, kwargs)` before, `post(module, args, output)` after the forward,
        and `backward(module, grad_input, grad_output)` when given; every handle removes one."""
        raise NotImplementedError

    # -- optimizer hooks and gradient statistics (probe.monitor_grads) ----------------------------
    def owns_optimizer(self, model: Any, optimizer: Any) -> bool:
        """Whether this framework trains `model` with `optimizer` (either may be None)."""
        return False

    def hook_optimizer(self, model: Any, optimizer: Any, select: ParamFilter, where: str,
                       before_step: StepCallback, after_step: StepCallback | None = None) -> OptimizerHooks:
        """Call `before_step` when the optimizer that steps the selected parameters is about to step
        (gradients final, parameters not yet changed) and `after_step` once it has stepped."""
        raise NotImplementedError

    def grad_stats(self, grads: Sequence[Any], level: str, bounds: Sequence[float],
                   state: dict[str, Any]) -> tuple[GradFinish, int]:
        """Queue the statistics of one step's gradients (lake/grad_stats.host_batch's semantics);
        returns the function the writer calls for the host batch, and the bytes in flight.
        `state` is one dict per monitor, kept between steps (device buffers, compiled kernels)."""
        raise NotImplementedError

    def param_fingerprints(self, params: Sequence[Any], background: bool = True) -> tuple[Callable[[], ParamBatch], int]:
        """Queue the fingerprints of parameters just updated (lake/grad_stats.host_fingerprints'
        semantics) on their device, without waiting for it; returns the function the writer calls
        for the host batch, and the bytes in flight. `background` False: where the parameters live on
        the host, compute them now on this thread (a stage block's weights: fewer than a thread pays for)."""
        raise NotImplementedError


class NumpyAdapter(Adapter):
    name = "numpy"

    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, (np.ndarray, np.generic, bool, int, float))

    def as_array(self, value: Any) -> np.ndarray:
        if isinstance(value, bool):
            return np.array(value, dtype=np.bool_)
        if isinstance(value, int):
            if -(1 << 63) <= value < 1 << 63:
                return np.array(value, dtype=np.int64)
            if 0 <= value < 1 << 64:
                return np.array(value, dtype=np.uint64)
            raise ProbeError(f"the int {_short(value)} does not fit in 64 bits (int64 or uint64), the widest integer "
                             "a tensor holds; pass it as a float, or split it")
        if isinstance(value, float):
            return np.array(value, dtype=np.float64)
        return np.asarray(value)

    def dtype_name(self, value: Any) -> str:
        dtype = self.as_array(value).dtype
        name = "bool" if dtype == np.bool_ else dtype.name
        if name not in SUPPORTED:
            raise ProbeError(f"unsupported numpy dtype {dtype}; supported: {', '.join(SUPPORTED)}")
        return name

    def stage(self, values: Sequence[Any], keep_raw: bool) -> list[StagedLeaf]:
        staged = []
        for value in values:
            arr = np.array(self.as_array(value), copy=True, order="C")  # a snapshot, C order
            staged.append(StagedLeaf(self.dtype_name(arr), arr.shape, arr, nbytes=arr.nbytes))
        return staged

    def from_host(self, array: np.ndarray, dtype: str, like: Any) -> Any:
        if dtype in WIDENED_FLOATS and dtype != "float16":
            raise ProbeError(f"numpy has no {dtype}: the baseline's {dtype} tensor can only be replayed into a "
                             "framework tensor (pass a torch tensor of that dtype)")
        out = np.array(array, dtype=np.dtype(dtype), copy=True)  # a copy the caller may change
        if isinstance(like, np.generic) or (isinstance(like, (bool, int, float)) and out.ndim == 0):
            return out[()] if isinstance(like, np.generic) else out.item()
        return out


def _short(value: int) -> str:
    # str() of a huge int is slow, and refused past 4300 digits
    return str(value) if value.bit_length() <= 128 else f"({'-' if value < 0 else ''}{value.bit_length()} bits)"
