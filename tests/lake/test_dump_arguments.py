"""Dump's reading API refuses arguments it cannot mean: a kind that does not exist was read as an empty table
(a typo looked like a dump without that data), a step given as a text ended in an Arrow kernel error."""

from __future__ import annotations

import numpy as np
import pytest

import rlprobe


def test_an_unknown_kind_and_a_step_that_is_no_number_are_named(tmp_path):
    with rlprobe.Probe(tmp_path / "d") as p:
        p.save({"old_log_prob": np.arange(4, dtype=np.float32)})
        p.step()
    d = rlprobe.open(tmp_path / "d")
    assert d.arrow("key_data").num_rows == 1 and d.arrow("grad").num_rows == 0  # a kind the dump lacks: empty
    with pytest.raises(ValueError, match=r"no stats schema for kind 'keydata'; known: \['grad', 'key_data'"):
        d.arrow("keydata")
    assert (d.tensor("old_log_prob", np.int64(0)) == np.arange(4)).all()
    for bad in ({"step": "0"}, {"step": 0.0}, {"step": 0, "rank": True}, {"step": 0, "micro_step": None}):
        with pytest.raises(ValueError, match="step, rank and micro_step take whole numbers"):
            d.tensor("old_log_prob", **bad)
