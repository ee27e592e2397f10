"""Steps are committed at most every `flush_interval` seconds, at flush() and at close().

Committed steps are exactly the steps whose rows are on disk; a crash loses only the rows of
steps ended since the last commit, and a resumed run continues after the last committed step.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import rlprobe
from rlprobe import ProbeError


def _manifest(path: Path) -> dict:
    return json.loads((path / "rank0.json").read_text())


def _parts(path: Path) -> list[Path]:
    return sorted((path / "stats" / "key_data" / "rank=0").glob("part-*.parquet"))


def _save_steps(probe: rlprobe.Probe, steps: range) -> None:
    for s in steps:
        probe.save({"x": np.full(4, float(s), np.float32)})
        probe.log_metrics({"loss": float(s)})
        probe.step()


def test_steps_wait_for_the_interval_then_commit_together(tmp_path):
    path = tmp_path / "dump"
    probe = rlprobe.Probe(path, rank=0, world_size=1, flush_interval=3600)
    _save_steps(probe, range(5))
    probe.writer.wait_idle()
    assert _manifest(path)["committed_steps"] == []  # ended, not yet due
    assert _parts(path) == []
    probe.flush()
    assert _manifest(path)["committed_steps"] == [0, 1, 2, 3, 4]
    assert len(_parts(path)) == 1  # five steps, one part
    _save_steps(probe, range(5, 7))
    probe.close()
    dump = rlprobe.open(path)
    assert dump.complete is True
    assert dump.rank_manifests[0]["committed_steps"] == list(range(7))
    assert sorted(dump.key_data().collect()["step"].to_list()) == list(range(7))
    assert sorted(dump.scalars().collect()["step"].to_list()) == list(range(7))


def test_an_idle_writer_commits_when_the_interval_runs_out(tmp_path):
    path = tmp_path / "dump"
    probe = rlprobe.Probe(path, rank=0, world_size=1, flush_interval=0.2)
    _save_steps(probe, range(3))
    deadline = time.monotonic() + 30  # no further call: the writer's own timer commits them
    while _manifest(path)["committed_steps"] != [0, 1, 2]:
        assert time.monotonic() < deadline, _manifest(path)
        time.sleep(0.02)
    assert sorted(rlprobe.open(path).key_data().collect()["step"].to_list()) == [0, 1, 2]
    probe.close()


def test_deferred_calls_reach_the_writer_when_many_wait_and_give_the_rows_of_one_by_one(tmp_path):
    """Save calls wait on the training thread until the interval ends (the writer then works them
    out together), or until CALL_BATCH_COUNT of them (or CALL_BATCH_BYTES) wait; the rows are those
    of calls written one at a time (flush_interval=0 hands each step over as it ends)."""
    from rlprobe.capture.writer import CALL_BATCH_COUNT

    tables = {}
    for interval in (3600, 0):
        path = tmp_path / f"dump{interval}"
        probe = rlprobe.Probe(path, rank=0, world_size=1, flush_interval=interval)
        for s in range(3):
            for micro in range(2):
                probe.save({"x": np.full((2, 3), 10.0 * s + micro, np.float32), "absent": None},
                           sample_ids=[2 * micro, 2 * micro + 1])
            probe.step()
        if interval:
            assert len(probe.writer._deferred) == 3 * 2 + 3  # six calls, three ends of steps
            for _ in range(CALL_BATCH_COUNT - 6):
                probe.save({"x": np.zeros(2)})
            # CALL_BATCH_COUNT calls: once a step has ended, they wait for the next end (step_ended) ...
            assert len(probe.writer._deferred) == CALL_BATCH_COUNT + 3
            for _ in range(CALL_BATCH_COUNT):
                probe.save({"x": np.zeros(2)})
            assert probe.writer._deferred == []  # ... up to twice as many: handed over without waiting
        probe.close()
        dump = rlprobe.open(path)
        assert dump.rank_manifests[0]["committed_steps"] == [0, 1, 2, *([3] if interval else [])]
        kd = dump.key_data().collect().filter(pl.col("step") < 3).sort("step", "micro_step", "key")
        # which packed file holds a tensor depends on how the writer took the calls (docs/dump-format.md,
        # "Files"): the tensors themselves must be the same
        tensors = [None if r["tensor_file"] is None else dump.tensor(r["key"], r["step"], micro_step=r["micro_step"])
                   for r in kd.iter_rows(named=True)]
        kd = kd.drop("tensor_file", "tensor_offset", "tensor_length")
        samples = pl.from_arrow(dump.arrow("sample")).sort("step", "micro_step", "key", "row")
        tables[interval] = (kd, samples, tensors)
    assert tables[3600][0].equals(tables[0][0], null_equal=True)
    assert tables[3600][1].equals(tables[0][1], null_equal=True)
    assert tables[0][1].height == 3 * 2 * 2  # a row per sample
    assert [t is None for t in tables[0][2]] == [k == "absent" for k in tables[0][0]["key"]]
    for a, b in zip(tables[3600][2], tables[0][2]):
        assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b))


def test_zero_interval_commits_every_step(tmp_path):
    path = tmp_path / "dump"
    probe = rlprobe.Probe(path, rank=0, world_size=1, flush_interval=0)
    for s in range(3):
        _save_steps(probe, range(s, s + 1))
        probe.writer.wait_idle()
        assert _manifest(path)["committed_steps"] == list(range(s + 1))
    probe.close()


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), "1", True, None])
def test_bad_flush_interval_is_refused_before_anything_is_written(tmp_path, bad):
    path = tmp_path / "dump"
    with pytest.raises(ProbeError, match=r"flush_interval=.*expected seconds, a finite number >= 0"):
        rlprobe.Probe(path, rank=0, world_size=1, flush_interval=bad)
    assert not (path / "rank0.json").exists()


CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    import rlprobe

    probe = rlprobe.Probe(sys.argv[1], rank=0, world_size=1, flush_interval=3600)
    for s in range(5):
        probe.save({"x": np.full(4, float(s), np.float32)})
        probe.step()
        if s == 2:
            probe.flush()
    probe.writer.wait_idle()  # steps 3 and 4 are ended and their tensors written, not committed
    os._exit(1)
""")


def test_crash_loses_only_uncommitted_steps_and_append_resumes_after_them(tmp_path):
    path = tmp_path / "dump"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    dump = rlprobe.open(path)
    assert dump.complete is False
    assert dump.rank_manifests[0]["committed_steps"] == [0, 1, 2]
    assert sorted(dump.key_data().collect()["step"].to_list()) == [0, 1, 2]
    with rlprobe.Probe(path, rank=0, world_size=1, mode="append") as probe:
        assert probe.current_step == 3
        _save_steps(probe, range(3, 5))
    dump = rlprobe.open(path)
    assert dump.complete is True
    assert dump.rank_manifests[0]["committed_steps"] == [0, 1, 2, 3, 4]
    for s in range(5):
        np.testing.assert_array_equal(dump.tensor("x", s), np.full(4, float(s), np.float32))
    assert sorted(dump.key_data().collect()["step"].to_list()) == [0, 1, 2, 3, 4]


def test_a_failing_commit_is_retried_without_spinning(tmp_path, monkeypatch):
    """flush_interval=0 and a disk that keeps failing: the writer retries about once a second,
    not in a loop that burns a core and piles up error messages."""
    path = tmp_path / "dump"
    probe = rlprobe.Probe(path, rank=0, world_size=1, flush_interval=0, on_error="warn")
    sink = probe.writer.sink
    calls = []

    def failing_flush(committed_step=None):
        calls.append(time.monotonic())
        return ["writing key_data stats part: [Errno 28] No space left on device; rows kept for the next flush"]

    monkeypatch.setattr(sink, "flush", failing_flush)
    probe.save({"x": np.ones(3, np.float32)})
    probe.step()
    time.sleep(1.5)
    assert 1 <= len(calls) <= 3, len(calls)
    monkeypatch.undo()  # the disk is back: the next commit writes the step
    probe.writer.wait_idle()
    with pytest.warns(RuntimeWarning, match="No space left on device"):
        probe.flush()
    probe.close()
    dump = rlprobe.open(path)
    assert dump.complete and dump.rank_manifests[0]["committed_steps"] == [0]
    assert sorted(dump.key_data().collect()["step"].to_list()) == [0]


def test_a_failed_merge_still_commits_the_steps_whose_parts_were_written(tmp_path, monkeypatch):
    from rlprobe.lake.parts import PartStore

    def broken_merge(self):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PartStore, "merge_tiered", broken_merge)
    path = tmp_path / "dump"
    probe = rlprobe.Probe(path, rank=0, world_size=1, flush_interval=0, on_error="warn")
    _save_steps(probe, range(2))
    probe.writer.wait_idle()
    assert _manifest(path)["committed_steps"] == [0, 1]  # the rows are on disk, merged or not
    with pytest.warns(RuntimeWarning, match="merging key_data parts"):
        probe.flush()
    monkeypatch.undo()
    probe.close()
    assert sorted(rlprobe.open(path).key_data().collect()["step"].to_list()) == [0, 1]


def test_work_due_before_the_next_step_ends_starts_at_the_step_boundary(tmp_path, monkeypatch):
    """The writer's burst starts when a step ends if it would fall due before the next one ends (at the
    last step's pace), not in the middle of that step; never later than its own time (the clock is the
    test's: rlprobe reads time.monotonic)."""
    from rlprobe.capture.writer import CALL_BATCH_COUNT

    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    path = tmp_path / "dump"
    probe = rlprobe.Probe(path, rank=0, world_size=1, flush_interval=1.0)
    writer = probe.writer

    def step_at(t: float) -> None:
        clock[0] = t
        probe.save({"x": np.full(4, t, np.float32)})
        probe.step()

    step_at(1000.0)  # the first step's end: no pace known yet
    step_at(1000.2)  # pace 0.2 s: the work is due at 1001.0, after the next step's expected end (1000.4)
    assert len(writer._deferred) == 4  # two save calls, two ends of steps: waiting
    step_at(1000.85)  # pace 0.65 s: due before the next step's expected end (1001.5): handed over now
    assert writer._deferred == []
    deadline = time.perf_counter() + 60
    while _manifest(path)["committed_steps"] != [0, 1, 2]:  # and committed with them (due by 1001.5 too)
        assert time.perf_counter() < deadline, _manifest(path)
        time.sleep(0.01)
    step_at(1000.9)  # new work, due at 1001.9: waits
    assert len(writer._deferred) == 2
    for _ in range(CALL_BATCH_COUNT):  # as many calls as a batch takes: they wait for the step's end ...
        probe.save({"y": np.zeros(2)})
    assert len(writer._deferred) == CALL_BATCH_COUNT + 2
    step_at(1000.95)  # ... which hands them over, due or not
    assert writer._deferred == []
    probe.close()
    assert rlprobe.open(path).rank_manifests[0]["committed_steps"] == [0, 1, 2, 3, 4]
