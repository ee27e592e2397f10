"""A second device on the CPU, for tests: the same math with other rounding.

Inside `second_device()`, every `torch.nn.functional.linear` (so every `nn.Linear`, as in the PPO
example's models) accumulates its products in float64 and rounds the result once to the input's
dtype, where the CPU's float32 kernel accumulates in float32 in its own order: the results differ
by about one unit in the last place of each output, as the same model on another accelerator
(another reduction order, another accumulation width) would. A model kept in bfloat16 (the
example's ref-bf16 fault) still rounds to bfloat16, so a planted fault stays the same fault."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F


def _linear_float64(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    out = x.double() @ weight.double().t()
    if bias is not None:
        out = out + bias.double()
    return out.to(x.dtype)


@contextlib.contextmanager
def second_device() -> Iterator[None]:
    """Every F.linear (nn.Linear.forward calls it) computed as on another device while inside."""
    own = F.linear
    F.linear = _linear_float64
    try:
        yield
    finally:
        F.linear = own


def train_on_second_device(out, fault: str | None = None, **overrides):
    """The PPO example (tests/ppo_runs.train) run on the second device: every nn.Linear rounded as there."""
    from ppo_runs import train

    with second_device():
        return train(out, fault, **overrides)
