"""What the TRL integration relies on, checked before it installs anything.

TRL keeps the tensors rlprobe captures in locals of private methods (the current log-probs
live in `_compute_loss`, the per-function rewards in `_calculate_rewards`), so the
integration wraps those methods on the one trainer instance it is given. Each wrapped method
is listed here with the parameters it must take; a TRL whose methods differ is refused with
an error naming the method and the supported versions, instead of capturing part of the data
silently.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from rlprobe.errors import ProbeError

SUPPORTED_TRL = ">=1.16,<1.17"  # the range the tests run against (and the `trl` extra pins)
TESTED_TRL = "1.16.0"

# method -> leading parameter names (after self) that the wrappers pass on and read
ONLINE_METHODS: dict[str, tuple[str, ...]] = {
    "_generate_and_score_completions": ("inputs",),
    "_generate": ("prompts",),
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_get_per_token_logps_and_entropies": ("model", "input_ids", "attention_mask", "logits_to_keep"),
    "_prepare_inputs": ("generation_batch",),
    "compute_loss": ("model", "inputs", "return_outputs", "num_items_in_batch"),
    "training_step": ("model", "inputs", "num_items_in_batch"),
}
ONLINE_KEYWORDS = {"_get_per_token_logps_and_entropies": ("batch_size", "compute_entropy")}
ONLINE_ATTRIBUTES = ("accelerator", "args", "state", "model", "ref_model", "reward_funcs", "reward_func_names",
                     "reward_weights", "num_generations", "beta")
REWARD_METHODS: dict[str, tuple[str, ...]] = {
    "compute_loss": ("model", "inputs", "return_outputs", "num_items_in_batch"),
}


def trl_version() -> str:
    import trl

    return str(getattr(trl, "__version__", "unknown"))


def check_version() -> None:
    """Warn when TRL is outside the tested range (the signature checks still decide whether it works)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    version = trl_version()
    try:
        inside = Version(version) in SpecifierSet(SUPPORTED_TRL)
    except InvalidVersion:
        inside = False
    if not inside:
        warnings.warn(f"rlprobe.integrations.trl is tested with TRL {SUPPORTED_TRL} (last: {TESTED_TRL}); this is "
                      f"TRL {version}. Its trainer methods match what the integration needs, so capture goes on; "
                      "pin trl to the supported range if anything looks wrong", RuntimeWarning, stacklevel=3)


def unsupported(trainer: Any, what: str) -> ProbeError:
    return ProbeError(f"rlprobe.integrations.trl: {type(trainer).__name__} {what}. The integration supports TRL "
                      f"{SUPPORTED_TRL} (tested with {TESTED_TRL}; installed: TRL {trl_version()}); install a "
                      "supported version (pip install '.[trl]' in rlprobe's checkout), or capture with probe.save() by hand "
                      "(README, section 'With TRL')")


def check_methods(trainer: Any, methods: dict[str, tuple[str, ...]],
                  keywords: dict[str, tuple[str, ...]] | None = None, attributes: tuple[str, ...] = ()) -> None:
    """Raise a ProbeError unless every method exists and takes the expected parameters."""
    for name in attributes:
        if not hasattr(trainer, name):
            raise unsupported(trainer, f"has no attribute {name!r}")
    for name, expected in methods.items():
        method = getattr(type(trainer), name, None)
        if not callable(method):
            raise unsupported(trainer, f"has no method {name}()")
        try:
            params = list(inspect.signature(method).parameters.values())[1:]  # past self
        except (TypeError, ValueError):
            raise unsupported(trainer, f"has a method {name}() whose signature cannot be read") from None
        if any(p.kind is p.VAR_POSITIONAL for p in params):  # (*args, **kwargs): passes everything on
            continue
        names = [p.name for p in params]
        wanted = list(expected)
        if name == "_prepare_inputs":  # Trainer names it `inputs`, GRPO/RLOO `generation_batch`: one argument
            ok = len([p for p in params if p.default is p.empty]) == 1
        else:
            ok = names[:len(wanted)] == wanted
        missing = [k for k in (keywords or {}).get(name, ()) if k not in names]
        if not ok or missing:
            raise unsupported(trainer, f"has {name}({', '.join(names)}) where the integration expects "
                                       f"{name}({', '.join(wanted + list((keywords or {}).get(name, ())))}, ...)")


@dataclass
class Patch:
    """One method replaced on one trainer instance; `remove()` puts back what was there."""

    owner: Any
    name: str
    previous: Any  # the instance attribute that was there, or _MISSING

    def remove(self) -> None:
        if self.previous is _MISSING:
            self.owner.__dict__.pop(self.name, None)
        else:
            setattr(self.owner, self.name, self.previous)


_MISSING = object()


def patch(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Patch:
    """Replace `owner.name` on this instance only (the class and other trainers are untouched) by
    `make(original)`, where `original` is the bound method called so far."""
    previous = owner.__dict__.get(name, _MISSING)
    setattr(owner, name, make(getattr(owner, name)))
    return Patch(owner, name, previous)
