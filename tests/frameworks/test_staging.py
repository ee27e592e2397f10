"""The staging ring's slot bookkeeping (pinned or plain memory: the logic is the same)."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np

from rlprobe.frameworks.staging import ALIGN, StagingRing


def test_slots_are_disjoint_fifo_and_wrap():
    ring = StagingRing(np.zeros(10 * ALIGN, np.uint8))
    a, free_a = ring.alloc(4 * ALIGN)
    b, free_b = ring.alloc(4 * ALIGN)
    a.fill(1)
    b.fill(2)
    assert a.ctypes.data != b.ctypes.data and int(a.sum()) == 4 * ALIGN  # b did not overwrite a
    free_a()
    c, free_c = ring.alloc(3 * ALIGN)  # does not fit after b (2 slots left): wraps to the start
    assert c.ctypes.data == ring.buffer.ctypes.data
    assert int(b.sum()) == 2 * 4 * ALIGN  # still intact
    free_b()
    free_c()
    d, _ = ring.alloc(10 * ALIGN)  # everything back: the whole ring fits
    assert d.size == 10 * ALIGN


def test_out_of_order_release_frees_in_fifo_order():
    ring = StagingRing(np.zeros(8 * ALIGN, np.uint8))
    _, free_a = ring.alloc(4 * ALIGN)
    _, free_b = ring.alloc(4 * ALIGN)
    free_b()  # newer one first: the ring is still full until a goes
    got = []
    t = threading.Thread(target=lambda: got.append(ring.alloc(4 * ALIGN)))
    t.start()
    time.sleep(0.2)
    assert not got  # waiting: back-pressure, not an overlapping slot
    free_a()
    t.join(5)
    assert got and got[0][0].ctypes.data == ring.buffer.ctypes.data


def test_too_large_request_is_refused():
    assert StagingRing(np.zeros(4 * ALIGN, np.uint8)).alloc(5 * ALIGN) is None


# -- faulting the host ring's pages in ahead of use (issue 17: cold saves) ------------------------
def _resident(buffer: np.ndarray) -> np.ndarray:
    """Which pages of a page-aligned buffer are in memory, by mincore(2)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = -(-buffer.size // mmap.PAGESIZE)
    vec = np.zeros(pages, np.uint8)
    assert libc.mincore(buffer.ctypes.data, buffer.size, vec.ctypes.data) == 0, ctypes.get_errno()
    return (vec & 1).astype(bool)


def _mapped(nbytes: int) -> np.ndarray:
    import mmap

    return np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)


def test_host_ring_faults_in_only_a_bounded_margin_past_what_is_used():
    from rlprobe.frameworks.staging import _populator

    mib = 1 << 20
    slack = 2 * mib  # where transparent huge pages are on, a fault may bring in 2 MiB at once
    buffer = _mapped(64 * mib)
    ring = StagingRing(buffer, _populator(buffer), ahead=8 * mib)
    assert ring.wait_prefaulted(8 * mib, timeout=10)
    resident = _resident(buffer)
    page = buffer.size // resident.size
    assert resident[: 8 * mib // page].all() and not resident[(8 * mib + slack) // page:].any()  # not the ring
    _, free_a = ring.alloc(5 * mib)  # to 5 + 8 MiB, a whole 4 MiB step further: 16 MiB
    assert ring.wait_prefaulted(16 * mib, timeout=10)
    _, free_b = ring.alloc(5 * mib)  # furthest slot ends at 10 MiB: resident up to 18 MiB, rounded to 20
    assert ring.wait_prefaulted(20 * mib, timeout=10)
    resident = _resident(buffer)
    assert resident[: 20 * mib // page].all() and not resident[(20 * mib + slack) // page:].any()
    _, free_c = ring.alloc(1 * mib)  # ends at 11 MiB: 19 MiB lies within the target, the thread is not woken
    assert ring._target == 20 * mib
    free_a()
    free_b()
    free_c()
    ring.alloc(5 * mib)  # wrapped to the start: nothing new to fault in
    time.sleep(0.2)
    assert ring.faulted == 20 * mib and not _resident(buffer)[(20 * mib + slack) // page:].any()


def test_prefaulting_never_changes_bytes_already_written():
    """The ring's thread and the training thread may reach a page together: MADV_POPULATE_WRITE
    leaves what the training thread wrote as it is."""
    from rlprobe.frameworks.staging import _populator

    mib = 1 << 20
    buffer = _mapped(32 * mib)
    ring = StagingRing(buffer, _populator(buffer), ahead=0)  # nothing faulted in until the first slot
    slot, _ = ring.alloc(24 * mib)
    pattern = np.arange(slot.size // 4, dtype=np.uint32).view(np.uint8)
    np.copyto(slot, pattern)  # races the thread faulting [0, 24 MiB) in
    assert ring.wait_prefaulted(24 * mib, timeout=10)
    assert np.array_equal(slot, pattern) and not buffer[24 * mib:].any()


def test_a_new_probe_starts_the_host_ring_and_its_imports_before_the_first_save(tmp_path):
    """In a fresh process, Probe() makes the host ring (its first PREFAULT_AHEAD bytes faulted in
    by the ring's thread, no more) and has imported pyarrow.compute, whose ~100 ms import holding
    the GIL used to land on the first saves from the writer thread."""
    import subprocess
    import sys
    from pathlib import Path

    code = f"""
import json, sys, torch, rlprobe
from rlprobe.frameworks import staging
assert "host" not in staging._rings
probe = rlprobe.Probe({str(tmp_path / "d")!r})
ring = staging._rings.get("host")
ok = ring is not None and ring.wait_prefaulted(staging.PREFAULT_AHEAD, timeout=20)
print(json.dumps({{"ring": ring is not None, "prefaulted": ok, "faulted": ring.faulted if ring else None,
                  "ahead": staging.PREFAULT_AHEAD, "capacity": ring.capacity if ring else None,
                  "pyarrow_compute": "pyarrow.compute" in sys.modules}}))
probe.close()
"""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["ring"] and got["prefaulted"] and got["pyarrow_compute"]
    assert got["faulted"] == got["ahead"] < got["capacity"]
