"""PyTorch tensors on the CPU, CUDA or any other device.

CPU tensors are copied (a snapshot the training loop cannot change afterwards) and their
statistics are computed from that copy on the writer thread. Tensors on an accelerator are
stacked per (dtype, size) and reach the host through one pinned buffer per `save` call with a
non-blocking copy; the writer waits on one CUDA event, so the training thread never blocks on
the device. When the bytes travel anyway (tensors saved), the statistics are computed from
that host copy on the writer thread: no statistics kernels queue up on the training stream.
In stats-only mode nothing but the statistics leaves the device: they are computed there,
a few kernels per call, and copied back as one small float64 block.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from rlprobe.errors import ProbeError
from rlprobe.frameworks.base import Adapter, Handle, OptimizerHooks, ParamFilter, StagedLeaf, StepCallback
from rlprobe.frameworks.staging import aligned, host_ring, pinned_ring
from rlprobe.lake.encoding import SUPPORTED, storage_dtype
from rlprobe.lake.statistics import host_statistics

DEVICE_STATS = ("min", "max", "mean", "norm", "nan_count", "inf_count", "zero_count")
_INT_STATS = ("nan_count", "inf_count", "zero_count")

# raw bytes travel as a same-width type numpy understands
_STORAGE = {torch.bfloat16: torch.int16}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _STORAGE[getattr(torch, _name)] = torch.uint8


def _check_storage(t: torch.Tensor) -> None:
    """Refuse tensors whose elements cannot be copied out as one dense block."""
    if t.is_meta:
        raise ProbeError(f"a meta tensor (shape {tuple(t.shape)}) has no data to save; save the tensor "
                         "after it has been materialised on a real device")
    if t.layout != torch.strided or t.is_nested:
        layout = "nested" if t.is_nested else str(t.layout).removeprefix("torch.")
        raise ProbeError(f"a {layout} tensor cannot be saved as it is; save t.to_dense() (or its "
                         "indices and values under keys of their own)")


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = str(dtype).removeprefix("torch.")
        if name not in SUPPORTED:  # complex dtypes included
            raise ProbeError(f"unsupported torch dtype {dtype}; supported: {', '.join(SUPPORTED)}")
        _DTYPE_NAMES[dtype] = name
    return name


_DTYPE_NAMES: dict[torch.dtype, str] = {}  # the supported dtypes seen, by name (checked once each)


def _host_view(t: torch.Tensor) -> np.ndarray:
    """numpy view of a CPU tensor's bytes in the storage dtype of lake.encoding. A view with torch's
    negative (or conjugate) bit set, which numpy() and view() refuse, is resolved first: asked only then,
    since is_neg() and is_conj() give up the GIL like every torch call (each can wait up to a switch
    interval beside a busy writer thread)."""
    storage = _STORAGE.get(t.dtype)
    try:
        arr = (t.view(storage) if storage is not None else t).numpy()
    except RuntimeError:
        if not (t.is_neg() or t.is_conj()):
            raise
        t = t.resolve_conj().resolve_neg()
        arr = (t.view(storage) if storage is not None else t).numpy()
    return arr.view(np.uint16) if t.dtype == torch.bfloat16 else arr


def _stats_rows(x: torch.Tensor) -> torch.Tensor:
    """DEVICE_STATS of each row of a 2-D (tensors x elements) stack, as float64, without a host sync."""
    if x.dtype == torch.bool:
        x = x.view(torch.uint8)
    elif x.dtype in _STORAGE and x.dtype != torch.bfloat16:  # float8: few kernels accept it
        x = x.float()
    f64 = torch.float64
    # every launch counts (each costs microseconds of CPU time on the training thread), so
    # reductions produce float64 directly and everything is gathered by one stack
    lo, hi = torch.aminmax(x, dim=1)
    if not x.is_floating_point():
        x = x.double()
    mean = torch.mean(x, dim=1, dtype=f64)
    norm = torch.linalg.vector_norm(x, dim=1, dtype=f64)
    nan = torch.isnan(x).sum(dim=1, dtype=f64)
    inf = torch.isinf(x).sum(dim=1, dtype=f64)
    zero = (x == 0).sum(dim=1, dtype=f64)
    return torch.stack([lo.to(f64), hi.to(f64), mean, norm, nan, inf, zero], dim=1)


def _as_dict(row: np.ndarray) -> dict[str, float | int | None]:
    return {name: (int(v) if name in _INT_STATS else float(v)) for name, v in zip(DEVICE_STATS, row)}


class TorchAdapter(Adapter):
    name = "torch"
    module_kinds = "torch.nn.Module"
    optimizer_kinds = "a torch.nn.Module and/or torch.optim.Optimizer"

    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor)

    def dtype_name(self, value: Any) -> str:
        _check_storage(value)
        return _dtype_name(value.dtype)

    def stage(self, values: Sequence[torch.Tensor], keep_raw: bool) -> list[StagedLeaf]:
        leaves: list[StagedLeaf | None] = [None] * len(values)
        on_device: dict[torch.device, list[int]] = {}
        on_host: list[int] = []
        # detach() makes a tensor object on the training thread (0.5 us alone, ~10 us beside a busy writer,
        # whose turn with the GIL it gives): only where autograd tracks one
        detached = [t.detach() if t.requires_grad else t for t in values]
        for i, t in enumerate(detached):
            _check_storage(t)
            _dtype_name(t.dtype)  # refuses complex and other unsupported dtypes
            if t.is_cpu:
                on_host.append(i)
            else:
                on_device.setdefault(t.device, []).append(i)
        if on_host:
            self._stage_on_host([detached[i] for i in on_host], on_host, leaves)
        for device, idx in on_device.items():
            self._stage_on_device(device, [detached[i] for i in idx], keep_raw, idx, leaves)
        return leaves  # type: ignore[return-value]

    def _stage_on_host(self, tensors, idx, leaves) -> None:
        """Snapshots of CPU tensors, copied into one slot of the host staging ring with numpy's
        single-threaded copy (torch's parallel copy stalls in its thread pool for milliseconds
        when the writer thread holds the other core; fresh memory would page-fault)."""
        views = [_host_view(t) for t in tensors]
        sizes = [aligned(v.nbytes) for v in views]
        slot = host_ring().alloc(sum(sizes))
        release = None
        if slot is not None:
            buffer, give_back = slot
            pending = [len(views)]

            def release() -> None:
                pending[0] -= 1
                if pending[0] == 0:
                    give_back()

        offset = 0
        for k, (t, view) in enumerate(zip(tensors, views)):
            if slot is None:
                raw = np.array(view, copy=True, order="C")
            else:
                raw = buffer[offset:offset + view.nbytes].view(view.dtype).reshape(view.shape)
                np.copyto(raw, view)
                offset += sizes[k]
            leaves[idx[k]] = StagedLeaf(_DTYPE_NAMES[t.dtype], view.shape, raw, nbytes=raw.nbytes, release=release)

    def _stage_on_device(self, device, tensors, keep_raw, idx, leaves) -> None:
        """Tensors of one save call on one accelerator: tensors of equal dtype and size are
        stacked, so a call costs a fixed handful of kernels and two copies however many keys
        it holds. Statistics and raw bytes land in pinned host buffers; one event marks them."""
        cuda = device.type == "cuda"
        groups: dict[tuple[torch.dtype, int], list[int]] = {}
        for k, t in enumerate(tensors):
            if t.numel() > 0:
                groups.setdefault((t.dtype, t.numel()), []).append(k)
        stat_rows, row_of, raw_sources, raw_at, offset = [], {}, [], {}, 0
        for (dtype, numel), members in groups.items():
            flat = [tensors[k].reshape(-1) for k in members]
            stacked = flat[0][None] if len(flat) == 1 else torch.stack(flat)
            if not keep_raw:
                for k in members:
                    row_of[k] = len(row_of)
                stat_rows.append(_stats_rows(stacked))
            if keep_raw:
                storage = _STORAGE.get(dtype)
                src = stacked.view(storage) if storage is not None else stacked
                raw_sources.append((offset, src))
                for r, k in enumerate(members):
                    raw_at[k] = offset + r * src.shape[1] * src.element_size()
                offset += -(-src.numel() * src.element_size() // 64) * 64  # keep slices aligned
        stats_host = raw_host = None
        if stat_rows:
            stats_dev = stat_rows[0] if len(stat_rows) == 1 else torch.cat(stat_rows)
            stats_host = torch.empty(stats_dev.shape, dtype=torch.float64, pin_memory=cuda)
            stats_host.copy_(stats_dev, non_blocking=cuda)
        give_back = None
        if raw_sources:
            slot = pinned_ring(device).alloc(offset) if cuda else None
            if slot is not None:
                raw_host, give_back = slot
            else:  # larger than the staging ring (or not CUDA): a buffer of its own
                raw_host = torch.empty(offset, dtype=torch.uint8, pin_memory=cuda)
            for start, src in raw_sources:
                nbytes = src.numel() * src.element_size()
                raw_host[start:start + nbytes].view(src.dtype).view(src.shape).copy_(src, non_blocking=cuda)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()

        group = []
        for k, t in enumerate(tensors):
            leaf = StagedLeaf(_dtype_name(t.dtype), tuple(t.shape), None,
                              nbytes=t.numel() * t.element_size() if keep_raw else 0)
            leaves[idx[k]] = leaf
            group.append((k, leaf, t.numel()))
        state = {"done": False, "pending": len(group)}

        def release() -> None:  # the slot goes back once the writer is done with every leaf
            state["pending"] -= 1
            if state["pending"] == 0 and give_back is not None:
                give_back()

        def finish() -> None:  # runs on the writer thread, once for the whole call
            if state["done"]:
                return
            if event is not None:
                event.synchronize()
            rows = stats_host.numpy() if stats_host is not None else None
            raw_bytes = raw_host.numpy() if raw_host is not None else None
            for k, leaf, numel in group:
                np_dtype = storage_dtype(leaf.dtype)
                if k in row_of:
                    leaf.device_stats = _as_dict(rows[row_of[k]])
                elif k in raw_at:  # statistics come from this host copy on the writer thread
                    start = raw_at[k]
                    leaf.raw = raw_bytes[start:start + numel * np_dtype.itemsize].view(np_dtype).reshape(leaf.shape)
                elif keep_raw:  # empty tensor: nothing was copied
                    leaf.raw = np.empty(leaf.shape, np_dtype)
                else:
                    leaf.device_stats = host_statistics(np.empty(0, np.float32))
            state["done"] = True

        for _, leaf, _ in group:
            leaf.finish = finish
            leaf.release = release

    def from_host(self, array: np.ndarray, dtype: str, like: Any) -> torch.Tensor:
        # a copy: the lake's array may be a read-only view of its file, and the caller's tensor is its own
        t = torch.from_numpy(np.array(array, copy=True, order="C"))
        want = getattr(torch, dtype)
        return (t if t.dtype == want else t.to(want)).to(like.device)

    # -- processes ---------------------------------------------------------------------------
    def prepare(self) -> None:
        host_ring()  # its first pages are faulted in by a thread of its own while the probe sets up

    def rank_and_world(self) -> tuple[int, int] | None:
        return torch_rank_and_world()

    def broadcast_from_rank0(self, value: str) -> str | None:
        if not torch_rank_and_world():
            return None
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # -- module hooks --------------------------------------------------------------------------
    def owns_module(self, module: Any) -> bool:
        return isinstance(module, torch.nn.Module)

    def submodules(self, module: Any) -> Iterator[tuple[str, Any]]:
        return module.named_modules()

    def own_parameters(self, module: Any) -> list[tuple[str, Any]]:
        return list(module.named_parameters(recurse=False))

    def hook_module(self, module: Any, pre: Callable, post: Callable, backward: Callable | None) -> list[Handle]:
        handles = [module.register_forward_pre_hook(pre, with_kwargs=True), module.register_forward_hook(post)]
        if backward is not None:  # tensor and node hooks, not register_full_backward_hook: see torch_backward.py
            from rlprobe.frameworks.torch_backward import ModuleBackward

            handles.append(ModuleBackward(module, backward))
        return handles

    # -- optimizer hooks and gradient statistics ---------------------------------------------------
    def owns_optimizer(self, model: Any, optimizer: Any) -> bool:
        from rlprobe.frameworks.torch_backward import is_torch_training

        return is_torch_training(model, optimizer)

    def hook_optimizer(self, model: Any, optimizer: Any, select: ParamFilter, where: str,
                       before_step: StepCallback, after_step: StepCallback | None = None) -> OptimizerHooks:
        from rlprobe.frameworks.torch_backward import TorchOptimizerHooks

        return TorchOptimizerHooks(model, optimizer, select, where, before_step, after_step)

    def grad_stats(self, grads: Sequence[Any], level: str, bounds: Sequence[float], state: dict[str, Any]):
        from rlprobe.frameworks.torch_grads import launch

        return launch(grads, level, bounds, state)

    def param_fingerprints(self, params: Sequence[Any], background: bool = True):
        from rlprobe.frameworks.torch_grads import launch_fingerprints

        return launch_fingerprints(params, background)


def torch_rank_and_world() -> tuple[int, int] | None:
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None
