"""The staging ring's slot bookkeeping (pinned or plain memory: the logic is the same)."""

from __future__ import annotations

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
