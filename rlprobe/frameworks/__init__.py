"""Framework adapters, chosen by the value's type without importing frameworks not in use.

A framework is one adapter file (a subclass of `frameworks.base.Adapter`) and one line of
`ADAPTERS`: its name -> (the package whose import means it may be in use, "module:Class").
An adapter is imported only once its package is: a probe in a numpy-only process never loads
torch. Order matters where two adapters could answer: the first wins; numpy, which takes plain
Python numbers too, is asked last (see `adapter_for`).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Iterator

from rlprobe.frameworks.base import Adapter, StagedLeaf

__all__ = ["ADAPTERS", "Adapter", "StagedLeaf", "adapter_for", "adapter_for_module", "adapter_for_optimizer",
           "broadcast_from_rank0", "detect_rank_and_world", "framework_names", "get_adapter", "module_kinds",
           "optimizer_kinds", "prepare", "register", "unregister"]

ADAPTERS: dict[str, tuple[str, str]] = {
    "torch": ("torch", "rlprobe.frameworks.torch_adapter:TorchAdapter"),
    "mindspore": ("mindspore", "rlprobe.frameworks.mindspore_adapter:MindSporeAdapter"),
    "numpy": ("numpy", "rlprobe.frameworks.base:NumpyAdapter"),
}
FALLBACK = "numpy"  # asked for any value no adapter of its own package claims (bool, int, float, arrays)
_loaded: dict[str, Adapter] = {}
_by_package = {package: name for name, (package, _) in ADAPTERS.items() if name != FALLBACK}
# adapter_for's answer (an adapter's name, None: no framework) by the value's type: Adapter.is_tensor is a
# question of the type, and a save call asks it for every value (~2 us each beside a training step)
_by_type: dict[type, str | None] = {}
_MAX_TYPES = 1024


def register(name: str, package: str, target: str) -> None:
    """Add (or replace) a framework at run time, as one line of ADAPTERS does (a plug-in, a test)."""
    ADAPTERS[name] = (package, target)
    _reindex(name)


def unregister(name: str) -> None:
    ADAPTERS.pop(name, None)
    _reindex(name)


def _reindex(name: str) -> None:
    _loaded.pop(name, None)
    _by_type.clear()
    _by_package.clear()
    _by_package.update({p: n for n, (p, _) in ADAPTERS.items() if n != FALLBACK})


def framework_names() -> tuple[str, ...]:
    return tuple(ADAPTERS)


def get_adapter(name: str) -> Adapter:
    adapter = _loaded.get(name)
    if adapter is None:
        if name not in ADAPTERS:
            raise ValueError(f"unknown framework {name!r}; expected one of {framework_names()}")
        module, _, cls = ADAPTERS[name][1].partition(":")
        adapter = _loaded[name] = getattr(importlib.import_module(module), cls)()
    return adapter


def _in_use() -> Iterator[Adapter]:
    """The adapters whose package has been imported, in registry order."""
    for name, (package, _) in list(ADAPTERS.items()):
        if package in sys.modules:
            yield get_adapter(name)


def adapter_for(value: Any) -> Adapter | None:
    """The adapter that handles `value`, or None when no framework knows it (remembered per type)."""
    kind = type(value)
    try:
        name = _by_type[kind]
    except KeyError:
        name = _adapter_name(value)
        if len(_by_type) < _MAX_TYPES:
            _by_type[kind] = name
    return None if name is None else get_adapter(name)


def _adapter_name(value: Any) -> str | None:
    root = type(value).__module__.split(".", 1)[0]
    name = _by_package.get(root)
    if name is not None and root in sys.modules and get_adapter(name).is_tensor(value):
        return name
    return FALLBACK if get_adapter(FALLBACK).is_tensor(value) else None


def adapter_for_module(module: Any) -> Adapter | None:
    """The adapter that can hook `module` (a torch.nn.Module, a mindspore.nn.Cell, ...)."""
    return next((a for a in _in_use() if a.owns_module(module)), None)


def adapter_for_optimizer(model: Any, optimizer: Any) -> Adapter | None:
    """The adapter whose framework trains `model` with `optimizer` (either may be None)."""
    return next((a for a in _in_use() if a.owns_optimizer(model, optimizer)), None)


def module_kinds() -> str:
    """What module hooks accept, for messages: 'torch.nn.Module or mindspore.nn.Cell'."""
    kinds = [get_adapter(n).module_kinds for n in ADAPTERS if _kind_of(n, "module_kinds")]
    return " or ".join(kinds) or f"the modules of {' or '.join(ADAPTERS)}"


def optimizer_kinds() -> str:
    """What gradient monitors accept, for messages."""
    kinds = [get_adapter(n).optimizer_kinds for n in ADAPTERS if _kind_of(n, "optimizer_kinds")]
    return ", or ".join(kinds) or f"the modules and optimizers of {' or '.join(ADAPTERS)}"


def _kind_of(name: str, attribute: str) -> bool:
    """Whether adapter `name` declares `attribute`, without importing a framework that is not in use."""
    package = ADAPTERS[name][0]
    return package in sys.modules and bool(getattr(get_adapter(name), attribute))


def detect_rank_and_world() -> tuple[int, int]:
    """Rank and world size from the first framework whose communication is set up, else RANK/WORLD_SIZE."""
    for adapter in _in_use():
        found = adapter.rank_and_world()
        if found:
            return found
    rank = os.environ.get("RANK")
    world = os.environ.get("WORLD_SIZE")
    if rank is not None:
        r = _env_int("RANK", rank)
        return r, _env_int("WORLD_SIZE", world) if world else r + 1
    return 0, 1


def broadcast_from_rank0(value: str) -> str:
    """Rank 0's `value` on every rank, through the first framework whose communication is set up;
    `value` itself when none is (each rank then decides alone)."""
    for adapter in _in_use():
        agreed = adapter.broadcast_from_rank0(value)
        if agreed is not None:
            return agreed
    return value


def prepare(framework: str | None) -> None:
    """Let the adapters a new probe may use warm up (framework None: every framework in use)."""
    for adapter in _in_use():
        if framework in (None, adapter.name):
            adapter.prepare()


def _env_int(name: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        from rlprobe.errors import ProbeError

        raise ProbeError(f"environment variable {name}={value!r}: expected a whole number (as torchrun sets it); "
                         f"fix {name}, or pass rank= and world_size= to rlprobe.Probe") from None
