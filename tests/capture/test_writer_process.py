"""The writer process (rlprobe/capture/writer_process.py) works out key data outside the training
process: the dump it writes holds the writer thread's rows and tensors, byte for byte (the thread packs
the save calls of a step into one file, the process a file per call); its failures come back to the
training thread as ProbeErrors naming the file; a killed writer process is reported and the
writer thread takes over; calls it cannot take (snapshots outside the staging ring) keep the
sample occurrence counts right."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import rlprobe
from rlprobe import ProbeError
from rlprobe.capture import writer_process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the writer process needs a memfd")


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for name in ("RLPROBE_RUN_ID", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(writer_process.ENV, "1")  # opt-in since issue 15's third pass


def test_the_writer_process_is_off_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv(writer_process.ENV)
    with rlprobe.Probe(tmp_path / "dump", rank=0, world_size=1) as probe:
        assert probe.writer.process is None


def _workload(probe: rlprobe.Probe) -> None:
    """Save calls of every shape of row: sample ids and groups, derived ids, absent values, 0-d,
    empty, bf16, integers, repeated samples in a step (occurrences)."""
    g = torch.Generator().manual_seed(0)
    for step in range(3):
        ids = torch.arange(8) + 100 * step
        probe.save({"prompts": torch.randint(0, 50, (8, 6), generator=g), "responses": torch.randint(0, 50, (8, 5),
                    generator=g), "rewards": torch.randn(8, generator=g), "ref_log_prob": None,
                    "advantages": torch.randn(8, generator=g).to(torch.bfloat16)},
                   sample_ids=ids, group_ids=ids // 4)
        for micro in range(2):
            rows = ids[micro * 4:(micro + 1) * 4]
            probe.save({"log_prob": torch.randn(4, 5, generator=g), "loss": torch.tensor(0.25 * step),
                        "empty": torch.zeros(0, 3)}, sample_ids=rows)
        probe.save({"log_prob": torch.randn(4, 5, generator=g)}, sample_ids=ids[:4])  # second occurrences
        probe.save({"input_ids": torch.randint(0, 50, (4, 3), generator=g)})  # ids derived from the prompt rows
        probe.step()


def _dump(path: Path) -> tuple[list[dict], list[dict], dict[str, bytes], dict]:
    dump = rlprobe.open(path)
    order = ("step", "key", "micro_step", "index")
    rows = dump.key_data().sort(*order).collect().drop("rank").to_dicts()
    tensors = {}  # each row's tensor as its reader gives it: the bytes, dtype and shape stored
    for row in rows:
        if row.pop("tensor_file") is not None:
            array = dump.tensor(row["key"], row["step"], micro_step=row["micro_step"], index=row["index"])
            tensors[tuple(row[c] for c in order)] = (array.tobytes(), array.dtype.str, array.shape)
        del row["tensor_offset"], row["tensor_length"]  # where in which packed file: the files differ
    samples = dump.arrow("sample").sort_by([(c, "ascending") for c in ("step", "key", "micro_step", "row")])
    manifest = json.loads((path / "rank0.json").read_text())
    return rows, samples.drop_columns(["rank"]).to_pylist(), tensors, manifest


@pytest.mark.parametrize("stats_only", [False, True])
def test_the_writer_process_writes_what_the_writer_thread_writes(tmp_path, monkeypatch, stats_only):
    paths = {}
    for mode in ("0", "1"):
        monkeypatch.setenv(writer_process.ENV, mode)
        paths[mode] = tmp_path / f"dump{mode}"
        # flush_interval: the writer takes the calls together at flush(), however slow this machine is
        with rlprobe.Probe(paths[mode], rank=0, world_size=1, run_id="same", stats_only=stats_only,
                           flush_interval=3600) as probe:
            _workload(probe)
            probe.flush()
            in_process = probe.writer.process is not None and probe.writer.samples_remote
            assert in_process == (mode == "1")  # the work really went where the switch says
    thread, process = _dump(paths["0"]), _dump(paths["1"])
    assert process[0] == thread[0]  # key_data rows: statistics, hashes
    assert process[1] == thread[1]  # sample rows: ids, occurrences, row hashes
    assert len(process[1]) > 0 and any(r["occurrence"] == 1 for r in process[1])
    assert process[2] == thread[2]  # the tensors' bytes
    assert (len(process[2]) == 0) == stats_only
    # the same records (each padded to 64 bytes) in fewer files: 5 save calls a step, 3 steps, one packed file
    assert thread[3]["tensor_files"] == (0 if stats_only else 1)
    assert process[3]["tensor_files"] == 15 * thread[3]["tensor_files"]
    for field in ("committed_steps", "incomplete_steps", "rows", "tensor_bytes", "errors", "lost"):
        assert process[3][field] == thread[3][field], field


def test_a_tensor_the_writer_process_cannot_write_raises_naming_the_file(tmp_path, monkeypatch):
    path = tmp_path / "dump"
    probe = rlprobe.Probe(path, rank=0, world_size=1)
    assert probe.writer.process is not None
    probe.save({"x": torch.ones(3)})  # call 0: written
    blocked = path / "tensors" / "key_data" / "rank=0" / "steps=0-0.call=1.npys"
    blocked.mkdir(parents=True)
    (blocked / "z.npy").write_text("a folder where call 1's packed file goes")  # its rename into place fails
    probe.save({"y": torch.full((3,), 7.0), "w": torch.zeros(2)})
    with pytest.raises(ProbeError, match=r"key 'y' step 0 micro_step 0: tensor not written to .*steps=0-0\.call=1.*"
                                         r"its statistics are kept"):
        probe.flush()
    probe.step()
    probe.close()
    rows = {r["key"]: r for r in rlprobe.open(path).key_data().collect().to_dicts()}
    assert rows["y"]["tensor_file"] is None and rows["y"]["max"] == 7.0  # the statistics row is kept
    assert rows["w"]["tensor_file"] is None and rows["w"]["numel"] == 2
    assert rows["x"]["tensor_file"] is not None
    np.testing.assert_array_equal(rlprobe.open(path).tensor("x", 0), np.ones(3, np.float32))
    assert sorted(p.name for p in blocked.iterdir()) == ["z.npy"]  # what was there is left alone
    assert not [p for p in blocked.parent.iterdir() if p.name.startswith(".")]  # no temporary file left
    manifest = json.loads((path / "rank0.json").read_text())
    assert any("call=1" in e for e in manifest["errors"])
    assert {"kind": "key_data", "key": "y", "step": 0, "micro_step": 0, "index": "", "what": "tensor"} \
        in manifest["lost"]
    assert manifest["tensor_files"] == 1


def test_a_killed_writer_process_is_reported_and_the_writer_thread_takes_over(tmp_path):
    path = tmp_path / "dump"
    probe = rlprobe.Probe(path, rank=0, world_size=1)
    probe.save({"x": torch.zeros(4)}, sample_ids=torch.arange(4))
    probe.step()
    probe.flush()
    helper = probe.writer.process.process
    os.kill(helper.pid, signal.SIGKILL)
    helper.wait(timeout=30)
    probe.save({"x": torch.ones(4)}, sample_ids=torch.arange(4))
    with pytest.raises(ProbeError, match=r"writer process \(pid \d+\) was killed by signal 9.*step 1 is not "
                                         r"committed, the writer thread does the rest"):
        probe.flush()
    probe.step()
    probe.save({"x": torch.full((4,), 2.0)}, sample_ids=torch.arange(4))
    probe.step()
    probe.close()
    manifest = json.loads((path / "rank0.json").read_text())
    assert manifest["committed_steps"] == [0, 2] and manifest["incomplete_steps"] == [1]
    dump = rlprobe.open(path)
    np.testing.assert_array_equal(dump.tensor("x", 2), np.full(4, 2.0, np.float32))
    # step 1's rows were written by the thread, but the step stays uncommitted (its occurrence
    # counts died with the process)
    everything = rlprobe.open(path, include_uncommitted=True)
    assert sorted(everything.key_data().collect()["step"].to_list()) == [0, 1, 2]
    step1 = everything.key_data().collect().to_dicts()[1]
    assert step1["step"] == 1 and step1["max"] == 1.0 and step1["hash"] is not None  # written in full
    np.testing.assert_array_equal(everything.tensor("x", 1), np.ones(4, np.float32))
    with rlprobe.Probe(tmp_path / "next", rank=0, world_size=1) as fresh:  # a new probe gets a new process
        assert fresh.writer.process is not None and fresh.writer.process.process.pid != helper.pid


def test_calls_outside_the_ring_keep_the_occurrence_counts(tmp_path, monkeypatch):
    """numpy arrays are snapshots of their own (not in the staging ring): their calls are written
    by the thread, between calls written by the process, and the occurrences still count on."""
    for mode in ("0", "1"):
        monkeypatch.setenv(writer_process.ENV, mode)
        with rlprobe.Probe(tmp_path / mode, rank=0, world_size=1, run_id="same") as probe:
            ids = np.arange(4)
            probe.save({"x": torch.ones(4)}, sample_ids=ids)
            probe.save({"x": np.full(4, 2.0, np.float32)}, sample_ids=ids)
            probe.save({"x": torch.full((4,), 3.0)}, sample_ids=ids)
            probe.save({"x": np.full(4, 4.0, np.float32)}, sample_ids=ids)
            probe.step()
    got = {}
    for mode in ("0", "1"):
        table = rlprobe.open(tmp_path / mode).arrow("sample")
        table = table.sort_by([("micro_step", "ascending"), ("row", "ascending")])
        got[mode] = list(zip(*(table[c].to_pylist() for c in ("micro_step", "occurrence", "row_sum"))))
    assert got["1"] == got["0"]
    assert [o for _, o, _ in got["1"]] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4


def test_a_writer_process_that_cannot_start_leaves_the_work_to_the_thread_silently(tmp_path, monkeypatch):
    """An interpreter that cannot run the helper (here /bin/false in its place) loses nothing and
    raises nothing: the writer thread does the work, as where there is no writer process."""
    monkeypatch.setattr(writer_process, "_process", None)
    monkeypatch.setattr(sys, "executable", "/bin/false")
    path = tmp_path / "dump"
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        assert probe.writer.process is not None  # started, and about to fail
        probe.save({"x": torch.arange(4.0)}, sample_ids=torch.arange(4))
        probe.step()
        probe.flush()
        assert probe.writer.process is None
    manifest = json.loads((path / "rank0.json").read_text())
    assert manifest["errors"] == [] and manifest["committed_steps"] == [0]
    np.testing.assert_array_equal(rlprobe.open(path).tensor("x", 0), np.arange(4.0, dtype=np.float32))
    assert rlprobe.open(path).arrow("sample").num_rows == 4
    writer_process._process.stop()
