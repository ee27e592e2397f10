"""Staging rings: host memory that snapshots are copied into on their way to the writer.

One allocation (pinned memory for each accelerator, plain memory for CPU tensors) is carved
into slots in FIFO order; the writer hands slots back as it finishes with them. In steady
state a snapshot therefore costs neither a driver call (pinning) nor page faults (fresh
memory), and a full ring makes `save` wait (back-pressure) instead of growing.

Before that steady state, plain memory is fresh: the first copy into each page faults it in
(~17 ms for the 66 MB of the first 8 saves of benchmarks/save_overhead.py --cold). The host
ring therefore faults its pages in ahead of use on a thread of its own: from creation, the
first PREFAULT_AHEAD bytes, and then always PREFAULT_AHEAD past the furthest slot handed
out, rounded up to a whole _PREFAULT_STEP (so the thread wakes once per 4 MiB of snapshots, not
at every save), so only what the first steps use (plus that margin) is ever made resident, not
the whole ring. Linux's MADV_POPULATE_WRITE does it without writing a byte, so a page the training
thread is filling at that moment is left as it is; where it is missing, pages fault on first
use as before.

On Linux the host ring is a memfd (shared memory with a descriptor): the probe's writer process
(capture/writer_process.py) maps the same pages and reads the snapshots where they lie.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from collections import deque
from typing import Any, Callable

import numpy as np

ALIGN = 64
# as much as a probe lets be in flight by default (max_inflight_bytes); pages are touched only when used
DEFAULT_BYTES = int(os.environ.get("RLPROBE_STAGING_MB", "1024")) << 20
# how far past the furthest slot the host ring's pages are faulted in ahead of use
PREFAULT_AHEAD = int(os.environ.get("RLPROBE_STAGING_PREFAULT_MB", "64")) << 20
_PREFAULT_STEP = 4 << 20  # bytes per madvise call
MADV_POPULATE_WRITE = 23  # Linux >= 5.14


class StagingRing:
    """FIFO slots over one flat uint8 buffer (a numpy array or a torch tensor). Given
    `prefault(start, end)`, pages are faulted in `ahead` bytes past the furthest slot, by a
    thread of the ring's own."""

    def __init__(self, buffer: Any, prefault: Callable[[int, int], bool] | None = None, ahead: int = 0,
                 fd: int | None = None):
        self.buffer = buffer
        self.fd = fd  # a descriptor of the buffer's shared memory another process can map (None: private)
        self.capacity = int(buffer.shape[0])
        self._live: deque[list[int]] = deque()  # [start, end, released], oldest first
        self._head = 0
        self._cond = threading.Condition()
        self._prefault = prefault
        self._ahead = ahead
        self.faulted = 0  # bytes [0, faulted) are resident (faulted in by the ring's thread)
        self._target = 0
        self._prefaulting: threading.Thread | None = None
        self._prefault_cond = threading.Condition()
        if prefault is not None and ahead > 0:
            self._fault_in_to(ahead)

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
        if self._prefault is not None and start + size + self._ahead > self._target:
            # a whole step further: waking the ring's thread for each save's few KiB made it take the GIL
            # (twice) at every save call, each time a wait for the training thread beside a busy writer
            self._fault_in_to(-(-(start + size + self._ahead) // _PREFAULT_STEP) * _PREFAULT_STEP)
        return self.buffer[start:start + nbytes], lambda: self._release(slot)

    def _fault_in_to(self, end: int) -> None:
        with self._prefault_cond:
            self._target = min(self.capacity, max(self._target, end))
            if self._prefaulting is None:
                self._prefaulting = threading.Thread(target=self._prefault_loop, name="rlprobe-staging-prefault",
                                                     daemon=True)
                self._prefaulting.start()
            self._prefault_cond.notify()

    def _prefault_loop(self) -> None:
        while True:
            with self._prefault_cond:
                while self.faulted >= self._target:
                    if self.faulted >= self.capacity:
                        return
                    self._prefault_cond.wait()
                start, end = self.faulted, min(self._target, self.faulted + _PREFAULT_STEP)
            if not self._prefault(start, end):  # not supported here: pages fault on first use
                return
            with self._prefault_cond:
                self.faulted = end
                self._prefault_cond.notify_all()

    def wait_prefaulted(self, nbytes: int, timeout: float | None = None) -> bool:
        """Wait until the first `nbytes` are resident (for tests and benchmarks)."""
        with self._prefault_cond:
            return self._prefault_cond.wait_for(lambda: self.faulted >= min(nbytes, self._target), timeout)

    def offset_of(self, array: np.ndarray) -> int | None:
        """Where a C-contiguous numpy view of this ring's buffer starts in it; None for other arrays."""
        base = self.buffer.ctypes.data if isinstance(self.buffer, np.ndarray) else None
        if base is None or not array.flags.c_contiguous:
            return None
        at = array.ctypes.data - base
        return at if 0 <= at and at + array.nbytes <= self.capacity else None

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
    """The process's ring of plain memory for snapshots of CPU tensors (its first pages start
    being faulted in, off the calling thread, when it is made)."""
    ring = _rings.get("host")  # made once: no lock to take at every save call once it is
    if ring is not None:
        return ring
    with _rings_lock:
        if "host" not in _rings:
            fd = _shared_memory(DEFAULT_BYTES)
            memory = mmap.mmap(-1 if fd is None else fd, DEFAULT_BYTES)  # page-aligned, as madvise needs
            buffer = np.frombuffer(memory, np.uint8)
            _rings["host"] = StagingRing(buffer, _populator(buffer), PREFAULT_AHEAD, fd)
        return _rings["host"]


def _shared_memory(nbytes: int) -> int | None:
    """A memfd of `nbytes` (sparse: pages exist once touched), or None where there is none."""
    if not hasattr(os, "memfd_create"):
        return None
    try:
        fd = os.memfd_create("rlprobe-staging", getattr(os, "MFD_CLOEXEC", 0))
    except OSError:
        return None
    try:
        os.ftruncate(fd, nbytes)
    except OSError:
        os.close(fd)
        return None
    return fd


def _populator(buffer: np.ndarray) -> Callable[[int, int], bool] | None:
    """prefault(start, end) for `buffer` through madvise(MADV_POPULATE_WRITE): pages made resident
    and writable without a byte written; ctypes lets the GIL go meanwhile. None where there is
    no madvise; the function returns False where the kernel lacks the advice (before 5.14)."""
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    base = buffer.ctypes.data
    page = mmap.PAGESIZE

    def prefault(start: int, end: int) -> bool:
        start -= start % page
        end = min(buffer.size, -(-end // page) * page)
        return end <= start or madvise(base + start, end - start, MADV_POPULATE_WRITE) == 0

    return prefault


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
