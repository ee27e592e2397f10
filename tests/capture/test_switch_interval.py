"""The writer shortens the interpreter's switch interval while it works, and puts it back."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import rlprobe
from rlprobe.capture.calls import WORKING_SWITCH_INTERVAL, short_switch_interval
from rlprobe.lake.reader import open_dump


@pytest.fixture
def interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_shortened_while_working_and_put_back(interval):
    with short_switch_interval():
        assert sys.getswitchinterval() == WORKING_SWITCH_INTERVAL
    assert sys.getswitchinterval() == 0.005


def test_put_back_when_the_last_of_overlapping_writers_is_done(interval):
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with short_switch_interval():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second():
        first_in.wait(10)
        with short_switch_interval():
            second_in.set()
            first_out.wait(10)
            seen["after the first left"] = sys.getswitchinterval()  # the first started before, left before
        seen["after both"] = sys.getswitchinterval()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"after the first left": WORKING_SWITCH_INTERVAL, "after both": 0.005}


def test_a_value_set_meanwhile_or_already_shorter_is_kept(interval):
    with short_switch_interval():
        sys.setswitchinterval(0.002)  # the user's, while the writer worked
    assert sys.getswitchinterval() == 0.002
    sys.setswitchinterval(0.0001)
    shorter = sys.getswitchinterval()  # kept in microseconds: read back
    with short_switch_interval():
        assert sys.getswitchinterval() == shorter
    assert sys.getswitchinterval() == shorter


def test_a_probe_leaves_the_interval_as_it_found_it(tmp_path, interval, monkeypatch):
    set_to = []
    setswitchinterval = sys.setswitchinterval
    monkeypatch.setattr(sys, "setswitchinterval", lambda v: (set_to.append(v), setswitchinterval(v)))
    probe = rlprobe.Probe(tmp_path / "dump", flush_interval=0.0)
    for _ in range(3):
        probe.save({"log_prob": np.arange(8, dtype=np.float32).reshape(2, 4)})
        probe.log_metrics({"loss": 1.0})
        probe.step()
        probe.flush()
    probe.close()
    assert sys.getswitchinterval() == 0.005
    assert WORKING_SWITCH_INTERVAL in set_to and set_to[-1] == 0.005  # shortened while the writer worked
    assert len(open_dump(tmp_path / "dump").arrow("key_data")) == 3
