"""Parameter fingerprints of torch tensors after an optimizer step (docs/dump-format.md, "param").

On the CPU the numba kernel (cpu_grad_kernel.fingerprint) reads each parameter once, in a thread of its own
(the kernel releases the GIL): the training thread only starts it, and the next forward runs
beside it; the monitor waits for it before the same optimizer steps again (capture/params.py),
so the weights it reads are the ones this step left. On an accelerator a
few batched torch ops per parameter queue the digest, sum and norm on the device, and ONE
non-blocking copy into pinned host memory brings the step's fingerprints back; the writer
thread waits for its event, the training thread never does.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np
import torch

from rlprobe.frameworks.torch_grads import mix64
from rlprobe.lake.grad_stats import ParamBatch

Finish = Callable[[], ParamBatch]


def launch(params: Sequence[torch.Tensor], background: bool = True) -> tuple[Finish, int]:
    """Queue the fingerprints of `params`; returns (finish, host bytes). `finish()` may block on a
    device copy: call it off the training thread. `background` False: CPU parameters are read now,
    on this thread (a thread's start and its share of the GIL beside the forward cost more than the
    pass over a stage block's weights: 0.36 ms against 0.96 ms for the PPO example's actor)."""
    flats = [p.detach().reshape(-1) for p in params]
    if flats[0].device.type == "cpu":
        if not background:
            batch = cpu_fingerprints(flats)
            return (lambda: batch), 8 * 3 * len(flats)
        return _cpu(flats)
    return _device(flats, flats[0].device)


class CpuFingerprints:
    """The fingerprints of CPU parameters, computed in a thread started at once. Calling it (the
    writer does) returns the ParamBatch or raises what the thread raised; `reads_done()` waits
    until the thread has read every parameter (the monitor calls it before the next step)."""

    def __init__(self, flats: list[torch.Tensor]):
        self._batch: ParamBatch | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(flats,), name="rlprobe-param-fingerprints",
                                        daemon=True)
        self._thread.start()

    def _run(self, flats: list[torch.Tensor]) -> None:
        try:
            self._batch = cpu_fingerprints(flats)
        except BaseException as e:  # handed to the writer by __call__, which records it
            self._error = e

    def reads_done(self) -> None:
        self._thread.join()

    def __call__(self) -> ParamBatch:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._batch is not None
        return self._batch


def cpu_fingerprints(flats: list[torch.Tensor]) -> ParamBatch:
    """The fingerprints of CPU tensors, now, on this thread."""
    from rlprobe.frameworks.cpu_grad_kernel import fingerprint

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
    return ParamBatch(digests, floats)


def _cpu(flats: list[torch.Tensor]) -> tuple[Finish, int]:
    return CpuFingerprints(flats), 8 * 3 * len(flats)


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
