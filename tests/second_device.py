"""A second device on the CPU, for tests: the same math with other rounding.

Inside `second_device()`, every `torch.nn.functional.linear` (so every `nn.Linear`, as in the PPO
example's models) accumulates its products in float64 and rounds the result once to the input's
dtype, where the CPU's float32 kernel accumulates in float32 in its own order: the results differ
by about one unit in the last place of each output, as the same model on another accelerator
(another reduction order, another accumulation width) would. A model kept in bfloat16 (the
example's ref-bf16 fault) still rounds to bfloat16, so a planted fault stays the same fault.

Other devices (`second_device(**device)`, `train_on_second_device(..., device={...})`):
- `order_seed=S`: the products summed in float32 in an order drawn anew at every call from a
  generator seeded with S (a split-K or atomic-add reduction): two seeds are two independent draws
  of the same noise, as A's code rerun without determinism;
- `mantissa_bits=M`: both float32 inputs of every matmul rounded to M mantissa bits first (to nearest,
  ties to even; 10 is TF32, as tensor cores do): errors of ~2^-(M+1) of each product, beyond float32's
  tolerance for M up to about 16; with `order_seed` too, two such devices differ by their reduction
  order on top (the rounding of the inputs is the same on both)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.nn.functional as F


def _linear_float64(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    out = x.double() @ weight.double().t()
    if bias is not None:
        out = out + bias.double()
    return out.to(x.dtype)


def round_mantissa(x: torch.Tensor, bits_kept: int) -> torch.Tensor:
    """float32 `x` rounded to `bits_kept` mantissa bits (to nearest, ties to even; TF32: 10); other dtypes
    as they are."""
    if x.dtype != torch.float32 or bits_kept >= 23:
        return x
    bits = x.contiguous().view(torch.int32)
    dropped = 23 - bits_kept  # float32 keeps 23 mantissa bits
    bits = (bits + ((1 << (dropped - 1)) - 1) + ((bits >> dropped) & 1)) & ~((1 << dropped) - 1)
    # the gradient passes as through the unrounded input (a device rounds its forward, not the update's maths)
    return x + (bits.view(torch.float32) - x).detach()


def _linear_reordered(generator: torch.Generator | None, mantissa_bits: int | None):
    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if mantissa_bits is not None:
            x, weight = round_mantissa(x, mantissa_bits), round_mantissa(weight, mantissa_bits)
        if generator is not None:  # the same sum in another order, drawn per call
            perm = torch.randperm(x.shape[-1], generator=generator)
            x, weight = x[..., perm], weight[:, perm]
        out = x @ weight.t()
        return out if bias is None else out + bias

    return linear


@contextlib.contextmanager
def second_device(order_seed: int | None = None, mantissa_bits: int | None = None) -> Iterator[None]:
    """Every F.linear (nn.Linear.forward calls it) computed as on another device while inside: accumulated
    in float64 (the default), or, with `order_seed` and/or `mantissa_bits`, as the module's docstring says."""
    own = F.linear
    if order_seed is None and mantissa_bits is None:
        F.linear = _linear_float64
    else:
        generator = None if order_seed is None else torch.Generator().manual_seed(order_seed)
        F.linear = _linear_reordered(generator, mantissa_bits)
    try:
        yield
    finally:
        F.linear = own


def train_on_second_device(out, fault: str | None = None, device: dict[str, Any] | None = None, **overrides):
    """The PPO example (tests/ppo_runs.train) run on the second device (`device`: second_device's keyword
    arguments): every nn.Linear rounded as there."""
    from ppo_runs import train

    with second_device(**(device or {})):
        return train(out, fault, **overrides)
