"""Parameter fingerprints of torch tensors after an optimizer step (docs/dump-format.md, "param").

On the CPU the numba kernel (cpu_param_kernel) reads each parameter once. On an accelerator a
few batched torch ops per parameter queue the digest, sum and norm on the device, and ONE
non-blocking copy into pinned host memory brings the step's fingerprints back; the writer
thread waits for its event, the training thread never does.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from rlprobe.frameworks.torch_grads import mix64
from rlprobe.lake.param_stats import ParamBatch

Finish = Callable[[], ParamBatch]


def launch(params: Sequence[torch.Tensor]) -> tuple[Finish, int]:
    """Queue the fingerprints of `params`; returns (finish, host bytes). `finish()` may block on a
    device copy: call it off the training thread."""
    flats = [p.detach().reshape(-1) for p in params]
    if flats[0].device.type == "cpu":
        return _cpu(flats)
    return _device(flats, flats[0].device)


def _cpu(flats: list[torch.Tensor]) -> tuple[Finish, int]:
    from rlprobe.frameworks.cpu_param_kernel import fingerprint

    n = len(flats)
    digests, floats = np.zeros(n, np.uint64), np.zeros((n, 2), np.float64)
    for r, f in enumerate(flats):
        if f.numel() == 0:
            digests[r] = int(mix64(f))
            continue
        if f.dtype in (torch.float32, torch.float64):
            d, s, norm = fingerprint(f.contiguous().numpy())
        else:  # 16-bit floats, ints: the digest of their own bytes, the sums of float32 values
            raw = f.contiguous().view(torch.uint8)
            pad = (-raw.numel()) % 4
            words = (torch.cat([raw, raw.new_zeros(pad)]) if pad else raw).view(torch.int32).numpy()
            d, s, norm = fingerprint(f.float().numpy(), words.view(np.uint32))
        digests[r], floats[r] = d, (s, norm)
    batch = ParamBatch(digests, floats)
    return (lambda: batch), 8 * 3 * n


def _device(flats: list[torch.Tensor], device: torch.device) -> tuple[Finish, int]:
    """The accelerator path; it runs on CPU tensors too (the copy then skipped), which is how the
    CPU-only test suite checks its arithmetic against the numpy reference."""
    n = len(flats)
    wide = [f if f.dtype == torch.float64 else f.float() for f in flats]
    sums = torch.stack([torch.sum(f, dtype=torch.float64) for f in wide])
    norms = torch.stack([torch.linalg.vector_norm(f, dtype=torch.float64) for f in wide])
    digests = torch.stack([mix64(f) for f in flats])
    payload = torch.cat([digests.view(torch.uint8), torch.stack([sums, norms], 1).reshape(-1).view(torch.uint8)])
    event = None
    if device.type == "cpu":
        host = payload
    else:
        host = torch.empty(payload.numel(), dtype=torch.uint8, pin_memory=device.type == "cuda")
        host.copy_(payload, non_blocking=True)
        if device.type == "cuda":
            event = torch.cuda.Event()
            event.record()

    def finish() -> ParamBatch:
        if event is not None:
            event.synchronize()
        raw = host.numpy()
        return ParamBatch(raw[: 8 * n].view(np.int64).view(np.uint64).copy(),
                          raw[8 * n:].view(np.float64).reshape(n, 2).copy())

    return finish, int(payload.numel())
