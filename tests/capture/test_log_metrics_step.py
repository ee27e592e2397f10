"""log_metrics(values, step=): a scalar belongs to the step its caller names, also when that step
has already ended (a trainer callback that runs after `step()`), committed or not."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rlprobe
from rlprobe import ProbeError


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ("RLPROBE_RUN_ID", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def _scalars(path, **kw) -> list[tuple]:
    frame = rlprobe.open(path, **kw).scalars().collect().sort("step", "name")
    return frame.select("step", "name", "value").rows()


@pytest.mark.parametrize("flush_interval", [0, 3600], ids=["committed-before", "committed-after"])
def test_a_callback_after_step_records_at_the_step_that_ended(tmp_path, flush_interval):
    """flush_interval=0: the step is already committed when its metrics arrive; 3600: it is
    ended but waits for the commit that also writes its metrics."""
    path = tmp_path / "dump"
    with rlprobe.Probe(path, rank=0, world_size=1, flush_interval=flush_interval) as probe:
        for s in range(3):
            probe.save({"x": np.full(2, float(s), np.float32)})
            probe.step()
            if flush_interval == 0:
                probe.writer.wait_idle()  # step s is committed before its metrics arrive
                assert s in json.loads((path / "rank0.json").read_text())["committed_steps"]
            probe.log_metrics({"loss": 10.0 + s, "reward": float(s)}, step=s)  # the callback: the step that ended
            if s == 1:
                probe.flush()
                assert (1, "loss", 11.0) in _scalars(path)  # readers see it at once
        probe.log_metrics({"now": 1.0})  # the default is still the current step
    assert _scalars(path) == [(0, "loss", 10.0), (0, "reward", 0.0), (1, "loss", 11.0), (1, "reward", 1.0),
                              (2, "loss", 12.0), (2, "reward", 2.0), (3, "now", 1.0)]
    dump = rlprobe.open(path)
    assert dump.rank_manifests[0]["committed_steps"] == [0, 1, 2, 3]
    assert dump.connect().execute("select step, value from scalars where name = 'loss' order by step").fetchall() == \
        [(0, 10.0), (1, 11.0), (2, 12.0)]


def test_a_later_step_is_recorded_there(tmp_path):
    path = tmp_path / "dump"
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        probe.log_metrics({"lr": 1e-6}, step=np.int64(5))  # numpy integers are steps too
        probe.save({"x": np.zeros(2, np.float32)})
        probe.step()
    assert _scalars(path) == [(5, "lr", 1e-6)]
    assert rlprobe.open(path).rank_manifests[0]["committed_steps"] == [0, 5]  # closed: every step written


@pytest.mark.parametrize("step", [-1, 1.0, 2.5, "2", True, [1]])
def test_a_negative_or_non_integer_step_is_refused_and_records_nothing(tmp_path, step):
    path = tmp_path / "dump"
    probe = rlprobe.Probe(path, rank=0, world_size=1)
    probe.log_metrics({"loss": 1.0})
    with pytest.raises(ProbeError) as err:
        probe.log_metrics({"loss": 2.0, "other": 3.0}, step=step)
    assert f"log_metrics(step={step!r})" in str(err.value) and "whole number >= 0" in str(err.value)
    probe.step()
    probe.close()
    assert _scalars(path) == [(0, "loss", 1.0)]


def test_a_config_probe_passes_the_step_on(tmp_path):
    cfg = {"rlprobe_config": {"dump_path": str(tmp_path / "dump"), "key_data_dump": True}}
    probe = rlprobe.from_config(cfg, rank=0, world_size=1)
    probe.step()
    probe.log_metrics({"loss": 4.0}, step=0)
    probe.close()
    assert _scalars(tmp_path / "dump") == [(0, "loss", 4.0)]
    off = rlprobe.from_config({"rlprobe_config": {"enable": False}})
    assert off.log_metrics({"loss": 1.0}, step=3) is None


KILLED = textwrap.dedent("""
    import os, sys
    import numpy as np
    import rlprobe

    probe = rlprobe.Probe(sys.argv[1], rank=0, world_size=1, flush_interval=3600)
    for s in range(3):
        probe.save({"x": np.full(2, float(s), np.float32)})
        probe.step()
    probe.flush()                                    # steps 0-2 committed
    probe.log_metrics({"late": 1.0}, step=1)         # a committed step's late scalar...
    probe.log_metrics({"now": 2.0})                  # ...and one of the unfinished step 3
    probe.flush()                                    # both written; step 3 is not committed
    os._exit(1)
""")


def test_after_a_kill_a_committed_steps_late_scalar_is_shown_and_the_unfinished_steps_is_not(tmp_path):
    path = tmp_path / "dump"
    proc = subprocess.run([sys.executable, "-c", KILLED, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert _scalars(path) == [(1, "late", 1.0)]
    assert _scalars(path, include_uncommitted=True) == [(1, "late", 1.0), (3, "now", 2.0)]
