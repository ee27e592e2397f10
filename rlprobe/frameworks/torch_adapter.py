"""PyTorch tensors on the CPU, CUDA or any other device.

CPU tensors are cloned (a snapshot the training loop cannot change afterwards) and their
statistics are computed from that copy on the writer thread. Tensors on an accelerator get
their statistics computed there; the statistics of all tensors of one `save` call and their
raw bytes reach the host through pinned buffers with non-blocking copies, and the writer
waits on one CUDA event: the training thread never blocks on the device.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np
import torch

from rlprobe.errors import ProbeError
from rlprobe.frameworks.base import StagedLeaf
from rlprobe.lake.encoding import SUPPORTED
from rlprobe.lake.statistics import host_statistics

DEVICE_STATS = ("min", "max", "mean", "norm", "nan_count", "inf_count", "zero_count")
_INT_STATS = ("nan_count", "inf_count", "zero_count")

# raw bytes travel as a same-width type numpy understands
_STORAGE = {torch.bfloat16: torch.int16}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _STORAGE[getattr(torch, _name)] = torch.uint8


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in SUPPORTED:
        raise ProbeError(f"unsupported torch dtype {dtype}; supported: {', '.join(SUPPORTED)}")
    return name


def _host_view(t: torch.Tensor) -> np.ndarray:
    """numpy view of a CPU tensor's bytes in the storage dtype of lake.encoding."""
    storage = _STORAGE.get(t.dtype)
    arr = (t.view(storage) if storage is not None else t).numpy()
    return arr.view(np.uint16) if t.dtype == torch.bfloat16 else arr


def _stats_row(x: torch.Tensor) -> torch.Tensor:
    """The DEVICE_STATS of a non-empty tensor as one float64 vector, without a host sync."""
    x = x.reshape(-1)
    if x.dtype == torch.bool:
        x = x.view(torch.uint8)
    elif x.dtype in _STORAGE and x.dtype != torch.bfloat16:  # float8: few kernels accept it
        x = x.float()
    is_float = x.is_floating_point()
    lo, hi = torch.aminmax(x)
    xd = x.double()
    total = xd.sum()
    norm = torch.linalg.vector_norm(xd)
    if is_float:
        nan = torch.isnan(x).sum()
        inf = torch.isinf(x).sum()
    else:
        nan = inf = torch.zeros((), dtype=torch.int64, device=x.device)
    zero = x.numel() - torch.count_nonzero(x)
    return torch.stack([lo.double(), hi.double(), total / x.numel(), norm, nan.double(), inf.double(), zero.double()])


def _as_dict(row: np.ndarray) -> dict[str, float | int | None]:
    return {name: (int(v) if name in _INT_STATS else float(v)) for name, v in zip(DEVICE_STATS, row)}


class TorchAdapter:
    name = "torch"

    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor)

    def dtype_name(self, value: Any) -> str:
        return _dtype_name(value.dtype)

    def stage(self, values: Sequence[torch.Tensor], keep_raw: bool) -> list[StagedLeaf]:
        leaves: list[StagedLeaf | None] = [None] * len(values)
        on_device: dict[torch.device, list[int]] = {}
        for i, t in enumerate(values):
            t = t.detach()
            if t.is_complex() or t.dtype not in _STORAGE and str(t.dtype).removeprefix("torch.") not in SUPPORTED:
                raise ProbeError(f"unsupported torch dtype {t.dtype}; supported: {', '.join(SUPPORTED)}")
            if t.device.type == "cpu":
                snap = t.resolve_conj().resolve_neg().clone(memory_format=torch.contiguous_format)
                raw = _host_view(snap)
                leaves[i] = StagedLeaf(_dtype_name(t.dtype), tuple(t.shape), raw, nbytes=raw.nbytes)
            else:
                on_device.setdefault(t.device, []).append(i)
        for device, idx in on_device.items():
            self._stage_on_device(device, [values[i].detach() for i in idx], keep_raw, idx, leaves)
        return leaves  # type: ignore[return-value]

    def _stage_on_device(self, device, tensors, keep_raw, idx, leaves) -> None:
        cuda = device.type == "cuda"
        nonempty = [k for k, t in enumerate(tensors) if t.numel() > 0]
        stats_host = None
        if nonempty:
            stacked = torch.stack([_stats_row(tensors[k]) for k in nonempty])
            stats_host = torch.empty(stacked.shape, dtype=torch.float64, pin_memory=cuda)
            stats_host.copy_(stacked, non_blocking=cuda)
        raws: list[torch.Tensor | None] = []
        for t in tensors:
            if not keep_raw:
                raws.append(None)
                continue
            src = t if t.is_contiguous() else t.contiguous()
            storage = _STORAGE.get(t.dtype)
            if storage is not None:
                src = src.view(storage)
            dst = torch.empty(src.shape, dtype=src.dtype, pin_memory=cuda)
            dst.copy_(src, non_blocking=cuda)
            raws.append(dst)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()

        group = []
        for k, (t, raw) in enumerate(zip(tensors, raws)):
            nbytes = t.numel() * t.element_size()
            leaf = StagedLeaf(_dtype_name(t.dtype), tuple(t.shape), None, nbytes=nbytes if keep_raw else 0)
            leaves[idx[k]] = leaf
            group.append((k, leaf, raw))
        row_of = {k: r for r, k in enumerate(nonempty)}

        def finish() -> None:  # runs on the writer thread
            if event is not None:
                event.synchronize()
            rows = stats_host.numpy() if stats_host is not None else None
            for k, leaf, raw in group:
                leaf.raw = None if raw is None else (raw.numpy().view(np.uint16) if leaf.dtype == "bfloat16" else raw.numpy())
                leaf.device_stats = _as_dict(rows[row_of[k]]) if k in row_of else host_statistics(np.empty(0, np.float32))

        done = {"flag": False}

        def finish_once() -> None:
            if not done["flag"]:
                finish()
                done["flag"] = True

        for _, leaf, _ in group:
            leaf.finish = finish_once

    def rank_and_world(self) -> tuple[int, int] | None:
        return torch_rank_and_world()


def torch_rank_and_world() -> tuple[int, int] | None:
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None
