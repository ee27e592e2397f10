"""Staging rings: host memory that snapshots are copied into on their way to the writer.

One allocation (pinned memory for each accelerator, plain memory for CPU tensors) is carved
into slots in FIFO order; the writer hands slots back as it finishes with them. In steady
state a snapshot therefore costs neither a driver call (pinning) nor page faults (fresh
memory), and a full ring makes `save` wait (back-pressure) instead of growing.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Any, Callable

import numpy as np

ALIGN = 64
# as much as a probe lets be in flight by default (max_inflight_bytes); pages are touched only when used
DEFAULT_BYTES = int(os.environ.get("RLPROBE_STAGING_MB", "1024")) << 20


class StagingRing:
    """FIFO slots over one flat uint8 buffer (a numpy array or a torch tensor)."""

    def __init__(self, buffer: Any):
        self.buffer = buffer
        self.capacity = int(buffer.shape[0])
        self._live: deque[list[int]] = deque()  # [start, end, released], oldest first
        self._head = 0
        self._cond = threading.Condition()

    def alloc(self, nbytes: int) -> tuple[Any, Callable[[], None]] | None:
        """A slice of `nbytes` and the function that gives it back; None when the request can
        never fit (the caller then makes a buffer of its own)."""
        size = -(-max(nbytes, 1) // ALIGN) * ALIGN
        if size > self.capacity:
            return None
        with self._cond:
            while (start := self._fit(size)) is None:
                self._cond.wait()
            slot = [start, start + size, False]
            self._live.append(slot)
            self._head = start + size
        return self.buffer[start:start + nbytes], lambda: self._release(slot)

    def _fit(self, size: int) -> int | None:
        if not self._live:
            self._head = 0
            return 0
        tail = self._live[0][0]
        if self._head > tail:  # used: [tail, head); free: [head, end) and [0, tail)
            if self._head + size <= self.capacity:
                return self._head
            return 0 if size <= tail else None
        return self._head if self._head + size <= tail else None  # wrapped: free is [head, tail)

    def _release(self, slot: list[int]) -> None:
        with self._cond:
            slot[2] = True
            while self._live and self._live[0][2]:
                self._live.popleft()
            self._cond.notify_all()


_rings: dict[Any, StagingRing] = {}
_rings_lock = threading.Lock()


def host_ring() -> StagingRing:
    """The process's ring of plain memory for snapshots of CPU tensors."""
    with _rings_lock:
        if "host" not in _rings:
            _rings["host"] = StagingRing(np.empty(DEFAULT_BYTES, np.uint8))
        return _rings["host"]


def pinned_ring(device: Any) -> StagingRing:
    """The process's ring of pinned memory for copies from one CUDA device."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    with _rings_lock:
        if index not in _rings:
            _rings[index] = StagingRing(torch.empty(DEFAULT_BYTES, dtype=torch.uint8, pin_memory=True))
        return _rings[index]


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN
