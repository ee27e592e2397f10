"""Key-data tensor files: one packed file per save call (each tensor a .npy record at an offset,
seventh session), the save calls of a step that the writer takes together in one (twelfth session), the
save calls of all the steps it takes together in one, in a folder per rank (thirteenth session:
`tensors/key_data/rank=<R>/steps=<S0>-<S1>.call=<C>.npys`), and dumps in the layouts before it.

Readers follow each row's tensor_file (and tensor_offset/tensor_length where set), so a dump written
with a packed file a step (`tensors/key_data/step=<S>/rank=<R>/call=<C>.npys`), a folder per save call
(issue 15, `tensors/key_data/step=<S>/rank=<R>/call=<C>/<key>.npy`) or a folder per key, step, rank and
micro step (`tensors/key_data/key=<k>/step=<S>/rank=<R>/micro_step=<M>/<index>.npy`) reads as before.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from tests.lake.layouts import step_packs, unpack

import rlprobe
from rlprobe.lake.layout import safe_component
from rlprobe.lake.tensor_pack import pack_records
from rlprobe.pipeline.info_output import dump_info


def _write(path: Path, steps: int = 3, **kw) -> None:
    kw.setdefault("flush_interval", 3600)  # the writer takes every call at close(), however slow the machine
    with rlprobe.Probe(path, rank=0, world_size=1, **kw) as probe:
        for s in range(steps):
            probe.save({"log_prob": np.arange(6, dtype=np.float32) + s, "pair": [np.arange(3) * s, np.ones(2, bool)],
                        "cfg": {"lr": np.float64(0.5 + s)}, "old_log_prob": None})
            probe.save({"log_prob": np.full(4, -s, np.float32)})
            probe.step()


def _old_file(row: dict) -> str:
    """Where the format put a key-data tensor before issue 15."""
    stem = safe_component(row["index"]) if row["index"] else "_"
    return (f"tensors/key_data/key={safe_component(row['key'])}/step={row['step']}/rank=0/"
            f"micro_step={row['micro_step']}/{stem}.npy")


def _to_old_layout(path: Path) -> None:
    """Rewrite a dump as the format wrote it before issue 15: files moved, tensor_file rewritten."""
    unpack(path, _old_file)
    for folder in [*(path / "tensors" / "key_data").glob("step=*"), *(path / "tensors" / "key_data").glob("rank=*")]:
        shutil.rmtree(folder)


def test_the_save_calls_the_writer_takes_together_are_one_packed_file_of_aligned_npy_records(tmp_path):
    path = tmp_path / "dump"
    _write(path)  # the writer takes the calls of all 3 steps at close()
    dump = rlprobe.open(path)
    rows = dump.key_data().collect().to_dicts()
    at = {(r["key"], r["step"], r["micro_step"], r["index"]): r for r in rows}
    pack = "tensors/key_data/rank=0/steps=0-2.call=0.npys"
    assert {r["tensor_file"] for r in rows} == {pack, None}
    absent = at[("old_log_prob", 1, 0, "")]
    assert absent["tensor_file"] is None and absent["tensor_offset"] is None  # absent: a row, no record
    assert sorted(p.name for p in (path / pack).parent.iterdir()) == ["steps=0-2.call=0.npys"]  # no temporary
    records = pack_records(str(path / pack))
    # the records in the order the calls saved them, each where its row says, its data 64-byte aligned
    mine = [at[(k, step, m, i)] for step in range(3)
            for k, m, i in (("log_prob", 0, ""), ("pair", 0, "0"), ("pair", 0, "1"), ("cfg", 0, "lr"), ("log_prob", 1, ""))]
    assert [(r.offset, r.length) for r, _ in records] == [(m["tensor_offset"], m["tensor_length"]) for m in mine]
    assert all(r.offset % 64 == 0 and layout.data_offset % 64 == 0 for r, layout in records)
    assert [layout.shape for _, layout in records] == [(6,), (3,), (2,), (), (4,)] * 3
    for step in range(3):
        np.testing.assert_array_equal(dump.tensor("log_prob", step, micro_step=1), np.full(4, -step, np.float32))
        np.testing.assert_array_equal(dump.tensor("pair", step, index="0"), np.arange(3) * step)
        assert dump.tensor("cfg", step, index="lr") == np.float64(0.5 + step)
    on_disk = sorted(p.relative_to(path).as_posix() for p in (path / "tensors").rglob("*") if p.is_file())
    assert on_disk == [pack]
    assert dump.rank_manifests[0]["tensor_files"] == 1
    assert dump.rank_manifests[0]["tensor_bytes"] == (path / pack).stat().st_size


def test_steps_create_no_folders(tmp_path):
    """The point of packing (docs/trl.md "Overhead"): steps of 3 save calls of 22 tensors (TRL's) create one
    file for the steps the writer takes together and no folder a step, where a file a step and two folders
    (step=<S>/rank=<R>) cost the writer more than the rest of its file work on the test VM."""
    path = tmp_path / "dump"
    steps = 4
    with rlprobe.Probe(path, rank=0, world_size=1, flush_interval=3600) as probe:
        for s in range(steps):
            probe.save({f"rollout_{i}": np.full(8, s + i, np.float32) for i in range(12)})
            for micro in range(2):
                probe.save({f"update_{i}": np.full(16, micro, np.float32) for i in range(5)})
            probe.step()
            if s == 1:
                probe.flush()  # the writer takes steps 0-1 now, 2-3 at close()
    tensors = path / "tensors" / "key_data"
    files = sorted(p.relative_to(tensors).as_posix() for p in tensors.rglob("*") if p.is_file())
    folders = [p.relative_to(tensors).as_posix() for p in tensors.rglob("*") if p.is_dir()]
    assert files == ["rank=0/steps=0-1.call=0.npys", "rank=0/steps=2-3.call=0.npys"]
    assert folders == ["rank=0"]
    dump = rlprobe.open(path)
    assert dump.key_data().collect().height == 22 * steps
    np.testing.assert_array_equal(dump.tensor("update_4", 3, micro_step=1), np.full(16, 1, np.float32))
    np.testing.assert_array_equal(dump.tensor("rollout_11", 1), np.full(8, 12, np.float32))


def test_a_step_the_writer_takes_in_two_batches_has_two_files_named_after_their_first_calls(tmp_path):
    path = tmp_path / "dump"
    with rlprobe.Probe(path, rank=0, world_size=1, flush_interval=3600) as probe:
        probe.save({"a": np.arange(3)})
        probe.save({"a": np.arange(4)})
        probe.flush()  # the writer takes calls 0 and 1 now, call 2 and step 1 at close()
        probe.save({"a": np.arange(5)})
        probe.step()
        probe.save({"a": np.arange(6)})
        probe.step()
    dump = rlprobe.open(path)
    rows = {(r["step"], r["micro_step"]): r for r in dump.key_data().collect().to_dicts()}
    rank = "tensors/key_data/rank=0"
    assert [rows[0, m]["tensor_file"] for m in range(3)] == [f"{rank}/steps=0-0.call=0.npys"] * 2 + [
        f"{rank}/steps=0-1.call=2.npys"]
    assert rows[1, 0]["tensor_file"] == f"{rank}/steps=0-1.call=2.npys"
    assert [rows[0, m]["tensor_offset"] for m in range(3)] == [0, 192, 0]  # 128-byte header, data padded to 64
    assert rows[1, 0]["tensor_offset"] == 192
    for m in range(3):
        np.testing.assert_array_equal(dump.tensor("a", 0, micro_step=m), np.arange(3 + m))
    np.testing.assert_array_equal(dump.tensor("a", 1), np.arange(6))
    assert dump.rank_manifests[0]["tensor_files"] == 2


def test_a_packed_file_that_cannot_be_put_in_place_keeps_every_calls_statistics(tmp_path, monkeypatch):
    """Its rename fails (a folder is where it goes): the rows of each call in it, of every step, keep their
    statistics, no file, each named in the error; the next batch's file is written."""
    monkeypatch.delenv("RLPROBE_WRITER_PROCESS", raising=False)  # the writer thread's packing
    path = tmp_path / "dump"
    probe = rlprobe.Probe(path, rank=0, world_size=1, flush_interval=3600)
    blocked = path / "tensors" / "key_data" / "rank=0" / "steps=0-1.call=0.npys"
    blocked.mkdir(parents=True)
    (blocked / "z.npy").write_text("a folder where the packed file of steps 0-1 goes")
    probe.save({"x": np.ones(3)})
    probe.save({"y": np.full(2, 7.0), "w": np.zeros(2)})
    probe.step()
    probe.save({"x": np.full(2, 5.0)})
    probe.step()
    with pytest.raises(rlprobe.ProbeError) as raised:
        probe.flush()
    assert re.search(r"key 'x' step 0 micro_step 0: tensor not written to .*steps=0-1\.call=0\.npys.*its statistics "
                     r"are kept \(and 3 more; see .*rank0\.json\)", str(raised.value))
    probe.save({"x": np.ones(4)})
    probe.close()
    dump = rlprobe.open(path)
    errors = dump.rank_manifests[0]["errors"]
    for key, step in (("x", 0), ("y", 0), ("w", 0), ("x", 1)):
        assert any(re.search(rf"key '{key}' step {step} micro_step 0: tensor not written to .*steps=0-1\.call=0\.npys",
                             e) for e in errors), (key, errors)
    rows = {(r["key"], r["step"]): r for r in dump.key_data().collect().to_dicts()}
    assert [rows[k][("tensor_file")] for k in (("x", 0), ("y", 0), ("w", 0), ("x", 1))] == [None] * 4
    assert rows["y", 0]["max"] == 7.0 and rows["x", 1]["max"] == 5.0
    assert dump.rank_manifests[0]["committed_steps"] == [0, 1, 2]  # statistics kept: the steps are complete
    np.testing.assert_array_equal(dump.tensor("x", 2), np.ones(4))


def test_long_and_unsafe_names_are_records_of_one_file(tmp_path):
    path = tmp_path / "dump"
    long_key, long_index = "k" * 300, "i" * 300
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        probe.save({long_key: {long_index: np.arange(2), long_index + "x": np.arange(3)},
                    "a.b": np.ones(1), "a": {"b": np.zeros(1)}, "x/y": np.full(2, 7)})
    dump = rlprobe.open(path)
    rows = dump.key_data().collect().to_dicts()
    assert {r["tensor_file"] for r in rows} == {"tensors/key_data/rank=0/steps=0-0.call=0.npys"}
    assert len({r["tensor_offset"] for r in rows}) == 5
    np.testing.assert_array_equal(dump.tensor(long_key, 0, index=long_index + "x"), np.arange(3))
    np.testing.assert_array_equal(dump.tensor("a.b", 0), np.ones(1))
    np.testing.assert_array_equal(dump.tensor("a", 0, index="b"), np.zeros(1))
    np.testing.assert_array_equal(dump.tensor("x/y", 0), np.full(2, 7))


def test_a_dump_with_a_folder_per_save_call_reads_as_before(tmp_path):
    """The layout from issue 15 to the seventh session: a .npy file per tensor in its call's folder."""
    new, old = tmp_path / "new", tmp_path / "old"
    _write(new)
    _write(old)
    unpack(old)
    assert sorted(p.name for p in (old / "tensors/key_data/step=1/rank=0").iterdir()) == ["call=0", "call=1"]
    a, b = rlprobe.open(new), rlprobe.open(old)
    rows_b = b.key_data().collect().to_dicts()
    assert all(r.get("tensor_offset") is None for r in rows_b)  # parts without the column: whole files
    assert any(r["tensor_file"] == "tensors/key_data/step=2/rank=0/call=0/pair@1.npy" for r in rows_b)
    _same_tensors_and_bytes(a, b, rows_b)
    log_prob = sum(r["tensor_length"] for r in a.key_data().collect().to_dicts() if r["key"] == "log_prob")
    assert log_prob == 3 * (128 + 24) + 3 * (128 + 16)  # records of header and data, no padding


def _same_tensors_and_bytes(a, b, rows_b: list[dict]) -> None:
    """Every tensor of dump b reads as dump a's, and `info` counts the same bytes a key: a record its own
    (header and data), a whole file its size."""
    for r in rows_b:
        if r["tensor_file"] is not None:
            got = b.tensor(r["key"], r["step"], micro_step=r["micro_step"], index=r["index"])
            want = a.tensor(r["key"], r["step"], micro_step=r["micro_step"], index=r["index"])
            assert got.dtype == want.dtype and np.array_equal(got, want), r
    info_a, info_b = dump_info(a), dump_info(b)
    assert info_a["problems"] == info_b["problems"] == []
    bytes_a = {k["key"]: k["bytes"] for k in info_a["keys"]}
    assert bytes_a == {k["key"]: k["bytes"] for k in info_b["keys"]}
    assert bytes_a["log_prob"] == sum(r["tensor_length"] for r in a.key_data().collect().to_dicts()
                                      if r["key"] == "log_prob")


def test_a_dump_in_the_layout_before_issue_15_reads_as_before(tmp_path):
    new, old = tmp_path / "new", tmp_path / "old"
    _write(new)
    _write(old)
    _to_old_layout(old)
    assert not list((old / "tensors" / "key_data").glob("step=*"))
    a, b = rlprobe.open(new), rlprobe.open(old)
    rows_b = b.key_data().collect().to_dicts()
    assert any("/micro_step=1/_.npy" in (r["tensor_file"] or "") for r in rows_b)
    _same_tensors_and_bytes(a, b, rows_b)


def test_appending_to_an_old_layout_dump_removes_its_uncommitted_step(tmp_path):
    """mode="append" removes the tensors of steps that are not committed, in either layout."""
    import json

    path = tmp_path / "dump"
    _write(path)
    _to_old_layout(path)
    manifest = json.loads((path / "rank0.json").read_text())
    manifest["committed_steps"] = [0, 1]  # as if killed before step 2 was committed
    manifest["closed"] = False
    (path / "rank0.json").write_text(json.dumps(manifest))
    assert list((path / "tensors" / "key_data").glob("*/step=2/rank=0"))
    with rlprobe.Probe(path, rank=0, world_size=1, mode="append") as probe:
        assert probe.current_step == 2
        probe.save({"log_prob": np.full(6, 42.0, np.float32)})
        probe.step()
    assert not list((path / "tensors" / "key_data").glob("*/step=2/rank=0"))  # the old layout's step 2
    dump = rlprobe.open(path)
    np.testing.assert_array_equal(dump.tensor("log_prob", 2), np.full(6, 42.0, np.float32))
    np.testing.assert_array_equal(dump.tensor("log_prob", 1, micro_step=1), np.full(4, -1, np.float32))
    assert (path / "tensors" / "key_data" / "rank=0" / "steps=2-2.call=0.npys").is_file()


def _killed_after(path: Path, committed: list[int]) -> None:
    """Make the dump's rank 0 look as if its writer was killed with only `committed` committed."""
    import json

    manifest = json.loads((path / "rank0.json").read_text())
    manifest["committed_steps"] = committed
    manifest["closed"] = False
    (path / "rank0.json").write_text(json.dumps(manifest))


def test_a_dump_with_a_packed_file_a_step_reads_and_resumes_as_before(tmp_path):
    """The layout of the twelfth session (change 13): `step=<S>/rank=<R>/call=<C>.npys`. It reads as today's,
    and resuming it removes the folder of its uncommitted step."""
    new, old = tmp_path / "new", tmp_path / "old"
    _write(new)
    _write(old)
    step_packs(old)
    assert sorted(p.relative_to(old / "tensors").as_posix() for p in (old / "tensors").rglob("*.npys")) == [
        f"key_data/step={s}/rank=0/call=0.npys" for s in range(3)]
    a, b = rlprobe.open(new), rlprobe.open(old)
    _same_tensors_and_bytes(a, b, b.key_data().collect().to_dicts())
    _killed_after(old, [0, 1])
    with rlprobe.Probe(old, rank=0, world_size=1, mode="append") as probe:
        assert probe.current_step == 2
        probe.save({"log_prob": np.full(6, 42.0, np.float32)})
        probe.step()
    assert not (old / "tensors" / "key_data" / "step=2" / "rank=0").exists()
    dump = rlprobe.open(old)
    np.testing.assert_array_equal(dump.tensor("log_prob", 2), np.full(6, 42.0, np.float32))
    np.testing.assert_array_equal(dump.tensor("log_prob", 1, micro_step=1), np.full(4, -1, np.float32))


@pytest.mark.parametrize("committed", [[0, 1, 2], [0, 1]])
def test_resuming_keeps_a_packed_file_with_a_committed_step_and_removes_one_without(tmp_path, committed):
    """A killed writer's packed file of steps 2-3: with step 2 committed it stays (step 2's records are read from
    it; step 3's rows are dropped), with neither committed it goes. The resumed steps' file has its own name."""
    path = tmp_path / "dump"
    with rlprobe.Probe(path, rank=0, world_size=1, flush_interval=3600) as probe:
        for s in range(4):
            probe.save({"log_prob": np.full(3, s, np.float32)})
            probe.step()
            if s == 1:
                probe.flush()
    packs = path / "tensors" / "key_data" / "rank=0"
    assert sorted(p.name for p in packs.iterdir()) == ["steps=0-1.call=0.npys", "steps=2-3.call=0.npys"]
    _killed_after(path, committed)
    with rlprobe.Probe(path, rank=0, world_size=1, mode="append") as probe:
        assert probe.current_step == len(committed)
        probe.save({"log_prob": np.full(3, 40.0 + probe.current_step, np.float32)})
        probe.step()
    resumed = len(committed)
    kept = ["steps=0-1.call=0.npys"] + (["steps=2-3.call=0.npys"] if 2 in committed else [])
    assert sorted(p.name for p in packs.iterdir()) == sorted(kept + [f"steps={resumed}-{resumed}.call=0.npys"])
    dump = rlprobe.open(path)
    assert dump.key_data().collect()["step"].to_list() == list(range(resumed + 1))
    for s in range(resumed):
        np.testing.assert_array_equal(dump.tensor("log_prob", s), np.full(3, s, np.float32))
    np.testing.assert_array_equal(dump.tensor("log_prob", resumed), np.full(3, 40.0 + resumed, np.float32))
    assert dump_info(dump)["problems"] == []


def test_overwriting_an_old_layout_dump_removes_its_tensors(tmp_path):
    path = tmp_path / "dump"
    _write(path)
    _to_old_layout(path)
    (path / "rank0.json").unlink()  # then the refusal names the data it found
    with pytest.raises(rlprobe.ProbeError, match=r"tensors/key_data/key=\w+/step=\d/rank=0"):
        rlprobe.Probe(path, rank=0, world_size=1)
    _write(path, steps=1, mode="overwrite")
    assert not list((path / "tensors" / "key_data").glob("key=*/step=*/rank=0"))
    assert sorted(p.name for p in (path / "tensors").rglob("*") if p.is_file()) == ["steps=0-0.call=0.npys"]


def test_a_hidden_call_folder_or_packed_file_is_read_by_no_one(tmp_path):
    """What a writer killed before its rename leaves: a hidden folder (before the seventh session), perhaps
    with whole files in it, or a hidden packed file."""
    path = tmp_path / "dump"
    _write(path, steps=1)
    before = dump_info(rlprobe.open(path))
    calls = path / "tensors" / "key_data" / "rank=0"
    hidden = calls / ".call=2.tmp-1234-deadbeef"
    hidden.mkdir()
    for i in range(40):  # many files, each of many elements
        np.save(hidden / f"k{i}.npy", np.zeros(1000, np.float32))
    with open(calls / ".call=3.npys.tmp-1234-beefdead", "wb") as f:
        for i in range(40):
            np.save(f, np.zeros(1000, np.float32))
    dump = rlprobe.open(path)
    after = dump_info(dump)
    assert after["keys"] == before["keys"] and after["problems"] == []
    np.testing.assert_array_equal(dump.tensor("log_prob", 0), np.arange(6, dtype=np.float32))
