"""Framework adapters, chosen by the value's type without importing frameworks not in use."""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from typing import Any

from rlprobe.frameworks.base import Adapter, StagedLeaf

__all__ = ["Adapter", "StagedLeaf", "adapter_for", "detect_rank_and_world", "prepare_staging", "FRAMEWORKS"]
FRAMEWORKS = ("torch", "mindspore", "numpy")


@lru_cache(maxsize=None)
def get_adapter(name: str) -> Adapter:
    if name == "torch":
        from rlprobe.frameworks.torch_adapter import TorchAdapter

        return TorchAdapter()
    if name == "mindspore":
        from rlprobe.frameworks.mindspore_adapter import MindSporeAdapter

        return MindSporeAdapter()
    if name == "numpy":
        from rlprobe.frameworks.numpy_adapter import NumpyAdapter

        return NumpyAdapter()
    raise ValueError(f"unknown framework {name!r}; expected one of {FRAMEWORKS}")


def adapter_for(value: Any) -> Adapter | None:
    """The adapter that handles `value`, or None when no framework knows it."""
    root = type(value).__module__.split(".", 1)[0]
    if root in ("torch", "mindspore") and root in sys.modules:
        adapter = get_adapter(root)
        if adapter.is_tensor(value):
            return adapter
    numpy = get_adapter("numpy")
    return numpy if numpy.is_tensor(value) else None


def detect_rank_and_world() -> tuple[int, int]:
    """Rank and world size from torch.distributed, MindSpore communication, or RANK/WORLD_SIZE."""
    if "torch" in sys.modules:
        from rlprobe.frameworks.torch_adapter import torch_rank_and_world

        found = torch_rank_and_world()
        if found:
            return found
    if "mindspore" in sys.modules:
        from rlprobe.frameworks.mindspore_adapter import mindspore_rank_and_world

        found = mindspore_rank_and_world()
        if found:
            return found
    rank = os.environ.get("RANK")
    world = os.environ.get("WORLD_SIZE")
    if rank is not None:
        r = _env_int("RANK", rank)
        return r, _env_int("WORLD_SIZE", world) if world else r + 1
    return 0, 1


def _env_int(name: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        from rlprobe.errors import ProbeError

        raise ProbeError(f"environment variable {name}={value!r}: expected a whole number (as torchrun sets it); "
                         f"fix {name}, or pass rank= and world_size= to rlprobe.Probe") from None


def prepare_staging(framework: str | None) -> None:
    """Make the host staging ring now if this probe may stage into it (torch CPU tensors), so its
    first pages are faulted in before the first saves need them (frameworks/staging.py)."""
    if framework in (None, "torch") and "torch" in sys.modules:
        from rlprobe.frameworks.staging import host_ring

        host_ring()
