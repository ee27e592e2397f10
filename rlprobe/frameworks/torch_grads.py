"""Gradient statistics and parameter fingerprints of many torch tensors on their device, returned to the host
in ONE copy per step.

Gradients: the float64 stats matrix, the int64 digests and the packed sign bits travel as one uint8 buffer
(pinned and non-blocking on CUDA). On CUDA, L1 and L2 use the fused Triton kernel
(frameworks/triton_grad_kernel.py: every gradient read once, two launches a step) where Triton is installed;
otherwise, and for L0's digests, the batched torch ops below (a handful per parameter) do the same work.

Parameter fingerprints after an optimizer step (docs/dump-format.md, "param"): on the CPU the C kernel
(cpu_grad_kernel.fingerprint) reads each parameter once, in a thread of its own (the kernel releases the GIL):
the training thread only starts it, and the next forward runs beside it; the monitor waits for it before the
same optimizer steps again (capture/params.py), so the weights it reads are the ones this step left. On an
accelerator a few batched torch ops per parameter queue the digest, sum and norm on the device, and ONE
non-blocking copy into pinned host memory brings the step's fingerprints back; the writer thread waits for its
event, the training thread never does.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import torch

from rlprobe.lake.grad_stats import (
    MIX_K1, MIX_K2, PACK_MAGIC, STAT_COLUMNS, Finish, GradBatch, ParamBatch, padded_bytes, sign_offsets,
)


def _to_host(payload: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, Any]:
    """`payload` (uint8, on `device`) on the host: itself on the CPU, else ONE non-blocking copy into pinned
    memory on CUDA (plain memory elsewhere), with the CUDA event the reader waits for (None where none)."""
    if device.type == "cpu":
        return payload, None
    host = torch.empty(payload.numel(), dtype=torch.uint8, pin_memory=device.type == "cuda")
    host.copy_(payload, non_blocking=True)
    if device.type != "cuda":
        return host, None
    event = torch.cuda.Event()
    event.record()
    return host, event


def mix64(flat: torch.Tensor) -> torch.Tensor:
    """`mix64` of a 1-D contiguous tensor's raw bytes, computed on its device (an int64 scalar)."""
    b = flat.contiguous().view(torch.uint8)
    pad = (-b.numel()) % 4
    if pad:
        b = torch.cat([b, b.new_zeros(pad)])
    w = b.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    i = torch.arange(w.numel(), device=w.device, dtype=torch.int64)
    h = (w ^ (i * MIX_K1)) * MIX_K2
    h = h ^ (h >> 31)
    return h.sum()


def _stats_matrix(flats: list[torch.Tensor], bounds: torch.Tensor | None, k: int) -> torch.Tensor:
    """float64 [n, k] on the device: max, min, norm, the NONZERO count (the host turns it into the
    zero count: numel is known there, and a device tensor of numels would be a blocking copy),
    then x <= bound per bound. A handful of ops per parameter and a few for all of them (each op
    is a kernel launch from the training thread): aminmax, count_nonzero, one broadcast compare
    and count for the bounds; the norms in one multi-tensor op; no per-value casts."""
    fs = [f if f.dtype in (torch.float32, torch.float64) else f.float() for f in flats]
    live = [f for f in fs if f.numel()]
    if live:
        mm = [torch.aminmax(f) for f in live]
        columns = [torch.stack([m.max for m in mm]), torch.stack([m.min for m in mm]),
                   torch.stack(torch._foreach_norm(live)), torch.stack([torch.count_nonzero(f) for f in live])]
        if bounds is not None:
            columns.append(torch.stack([_bound_counts(f, bounds) for f in live]))
        matrix = torch.cat([c.to(torch.float64).reshape(len(live), -1) for c in columns], dim=1)
    if len(live) == len(fs):
        return matrix
    empty = torch.zeros(k, dtype=torch.float64, device=fs[0].device)
    empty[:3] = float("nan")
    rows, j = [], 0
    for f in fs:  # zero-size gradients (rare): a NaN row in place
        if f.numel():
            rows.append(matrix[j])
            j += 1
        else:
            rows.append(empty)
    return torch.stack(rows)


def _bound_counts(f: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """int64 [len(bounds)]: x <= bound per bound (the right-closed intervals msprobe reports follow
    by difference). One broadcast comparison where its temporary stays small, else one per bound."""
    if f.numel() * bounds.numel() <= (1 << 26):
        return torch.count_nonzero(f.unsqueeze(0) <= bounds.to(f.dtype).unsqueeze(1), dim=1)
    return torch.stack([torch.count_nonzero(f <= v) for v in bounds.to(f.dtype).unbind(0)])


_BOUNDS: dict[tuple[tuple[float, ...], str], torch.Tensor] = {}


def _device_bounds(bounds: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """The bounds as a float32 tensor on `device`, made once: a tensor built from a Python list
    on an accelerator is a blocking copy, which would stall the training thread every step."""
    key = (bounds, str(device))
    t = _BOUNDS.get(key)
    if t is None:
        t = _BOUNDS[key] = torch.tensor(list(bounds), dtype=torch.float32, device=device)
    return t


def _launch_cpu(flats: list[torch.Tensor], level: str, bounds: Sequence[float]) -> tuple[Finish, int]:
    """The CPU path: one C pass per gradient (cpu_grad_kernel.pyx) writes its stats row and
    its packed signs straight into the host buffer; no device, so nothing to copy."""
    from rlprobe.frameworks.cpu_grad_kernel import stats_into

    n = len(flats)
    k = len(STAT_COLUMNS) + (len(bounds) if level == "L2" else 0)
    b = np.asarray(list(bounds), np.float32) if level == "L2" else None
    numels = [f.numel() for f in flats]
    offsets = sign_offsets(numels)
    n_sign_bytes = sum(padded_bytes(m) for m in numels) if level != "L0" else 0
    n_digest_bytes = 8 * n if level == "L0" else 0
    raw = np.empty(n * k * 8 + n_digest_bytes + n_sign_bytes, np.uint8)
    stat_matrix = raw[: n * k * 8].view(np.float64).reshape(n, k)
    signs = raw[n * k * 8 + n_digest_bytes:] if level != "L0" else None
    # One thread: right after backward, torch's OpenMP workers spin-wait on the other cores, so
    # a second kernel thread measured slower, not faster (benchmarks/grad_overhead.py).
    for r, f in enumerate(flats):
        if f.numel() == 0:
            stat_matrix[r] = 0.0
            stat_matrix[r, :3] = np.nan
            continue
        x = f if f.dtype in (torch.float32, torch.float64) else f.float()
        stats_into(x.contiguous().numpy(), b, stat_matrix[r], signs, offsets[r])
    if level == "L0":
        raw[n * k * 8: n * k * 8 + n_digest_bytes] = torch.stack([mix64(f) for f in flats]).view(torch.uint8).numpy()

    def finish() -> GradBatch:
        digests = raw[n * k * 8: n * k * 8 + n_digest_bytes].view(np.uint64) if level == "L0" else None
        return GradBatch(stat_matrix, digests, signs, offsets)  # views of `raw`, which nothing else writes

    return finish, int(raw.size)


def launch(grads: Sequence[torch.Tensor], level: str, bounds: Sequence[float],
           kernels: dict[str, Any] | None = None) -> tuple[Finish, int]:
    """Queue the statistics of `grads` on their device; returns (finish, host bytes). `finish()`
    waits for the copy and splits it; call it off the training thread. `kernels` is the caller's
    own dict (one per monitor) where the fused kernel keeps its device buffers between steps."""
    device = grads[0].device
    if device.type != "cpu":
        kernels = {} if kernels is None else kernels
        fused = _fused_kernel(grads, level, kernels)
        if fused is not None:
            try:  # the gradients as they are: contiguous ones are read in memory order, no views made
                return fused.launch(grads, bounds if level == "L2" else None)
            except Exception as e:  # e.g. no compiler for this GPU: the torch ops below still work
                kernels["triton"] = None
                warnings.warn(f"rlprobe: the Triton gradient kernel failed on {device} ({type(e).__name__}: {e}); "
                              "this monitor's gradient statistics use torch ops from now on", stacklevel=2)
    flats = [g.detach().reshape(-1) for g in grads]
    if device.type == "cpu":
        return _launch_cpu(flats, level, bounds)
    return _launch_device(flats, level, bounds, device)


def _fused_kernel(grads: Sequence[torch.Tensor], level: str, kernels: dict[str, Any]) -> Any:
    """The monitor's Triton kernel object, or None where the torch-ops path runs: L0 (digests),
    devices other than CUDA, gradients the kernel does not read (other dtypes, not contiguous),
    Triton missing or failed before."""
    if level == "L0" or grads[0].device.type != "cuda":
        return None
    if "triton" not in kernels:
        try:
            from rlprobe.frameworks.triton_grad_kernel import GradStatsKernel
        except ImportError:
            kernels["triton"] = None
        else:
            kernels["triton"] = GradStatsKernel()
    kernel = kernels["triton"]
    return kernel if kernel is not None and kernel.supports(grads) else None


def _launch_device(flats: list[torch.Tensor], level: str, bounds: Sequence[float],
                   device: torch.device) -> tuple[Finish, int]:
    """The accelerator path: batched torch ops on the device, one copy to pinned host memory and
    one event. Runs on CPU tensors too (the copy is then skipped), which is how the CPU-only test
    suite checks the device path's arithmetic."""
    k = len(STAT_COLUMNS) + (len(bounds) if level == "L2" else 0)
    b = _device_bounds(tuple(bounds), device) if level == "L2" else None
    stats = _stats_matrix(flats, b, k)
    pieces = [stats.reshape(-1).view(torch.uint8)]
    if level == "L0":
        pieces.append(torch.stack([mix64(f) for f in flats]).view(torch.uint8))
    numels = [f.numel() for f in flats]
    offsets = sign_offsets(numels)
    n_sign_bytes = 0
    if level != "L0":
        n_sign_bytes = sum(padded_bytes(n) for n in numels)
        bits = torch.zeros(n_sign_bytes * 8, dtype=torch.bool, device=device)
        for f, off in zip(flats, offsets):
            torch.gt(f, 0, out=bits[off * 8: off * 8 + f.numel()])
        words = bits.view(torch.uint8).view(torch.int64)
        pieces.append((((words * PACK_MAGIC) >> 56) & 0xFF).to(torch.uint8))
    payload = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
    host, event = _to_host(payload, device)
    n = len(flats)

    def finish() -> GradBatch:
        if event is not None:
            event.synchronize()
        raw = host.numpy()
        at = n * k * 8
        stat_matrix = raw[:at].view(np.float64).reshape(n, k).copy()
        stat_matrix[:, 3] = np.asarray(numels, np.float64) - stat_matrix[:, 3]  # nonzero -> zero count
        digests = None
        if level == "L0":
            digests = raw[at: at + 8 * n].view(np.int64).view(np.uint64).copy()
            at += 8 * n
        signs = raw[at: at + n_sign_bytes].copy() if level != "L0" else None
        return GradBatch(stat_matrix, digests, signs, offsets)

    return finish, int(payload.numel())


FingerprintsFinish = Callable[[], ParamBatch]


def launch_fingerprints(params: Sequence[torch.Tensor], background: bool = True) -> tuple[FingerprintsFinish, int]:
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


def _cpu(flats: list[torch.Tensor]) -> tuple[FingerprintsFinish, int]:
    return CpuFingerprints(flats), 8 * 3 * len(flats)


def _device(flats: list[torch.Tensor], device: torch.device) -> tuple[FingerprintsFinish, int]:
    """The accelerator path; it runs on CPU tensors too (the copy then skipped), which is how the
    CPU-only test suite checks its arithmetic against the numpy reference."""
    n = len(flats)
    wide = [f if f.dtype == torch.float64 else f.float() for f in flats]
    sums = torch.stack([torch.sum(f, dtype=torch.float64) for f in wide])
    norms = torch.stack([torch.linalg.vector_norm(f, dtype=torch.float64) for f in wide])
    digests = torch.stack([mix64(f) for f in flats])
    payload = torch.cat([digests.view(torch.uint8), torch.stack([sums, norms], 1).reshape(-1).view(torch.uint8)])
    host, event = _to_host(payload, device)

    def finish() -> ParamBatch:
        if event is not None:
            event.synchronize()
        raw = host.numpy()
        return ParamBatch(raw[: 8 * n].view(np.int64).view(np.uint64).copy(),
                          raw[8 * n:].view(np.float64).reshape(n, 2).copy())

    return finish, int(payload.numel())
