"""Packed key-data files (rlprobe/lake/tensor_pack.py): every reader that opens a key-data tensor reads a
record at its offset as it reads a whole .npy file (compare's batch, mapped and per-pair paths, check's
compiled reads and numpy's, `info`), and a record that is not where its row says is an error naming the
file, the offset and the key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rlprobe
from rlprobe.checks.run import check_dump
from rlprobe.comparison.executor import PairTask, run_pairs
from rlprobe.comparison.run import compare_dumps
from rlprobe.errors import DumpReadError
from rlprobe.lake.tensor_pack import PACK_BUFFERED_BELOW, Record, TensorPack, TensorRecordError, load_record, pack_records, record_layout

from tests.lake.layouts import unpack
from rlprobe.comparison.options import CompareOptions

MICRO = 20  # more pairs than compare's batch (16) and check's compiled path take


def _write(path: Path, shift: float = 0.0) -> None:
    rng = np.random.default_rng(0)
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        for step in range(2):
            for micro in range(MICRO):
                log_prob = rng.standard_normal((4, 16)).astype(np.float32) * 0.01 - 1
                mask = np.ones((4, 16), bool)
                mask[:, 12:] = micro % 2 == 0
                probe.save({"log_prob": log_prob + np.float32(shift * (micro == 3)), "old_log_prob": log_prob,
                            "response_mask": mask, "ids": np.arange(64, dtype=np.int32).reshape(4, 16) + micro,
                            "half": log_prob.astype(np.float16)})
            # a large tensor after a small one: its record starts off a page boundary (compare's mapped path)
            probe.save({"small": np.arange(5, dtype=np.float32),
                        "big": np.linspace(0, 1, 300_000, dtype=np.float32) + np.float32(shift)})
            probe.step()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packed")
    out = {}
    for name, shift in (("a", 0.0), ("b", 0.5)):
        out[name] = root / name
        _write(out[name], shift)
        out[f"{name}_folders"] = root / f"{name}_folders"
        _write(out[f"{name}_folders"], shift)
        unpack(out[f"{name}_folders"])
    return out


def _key_data(a: Path, b: Path) -> list[dict]:
    tables, _ = compare_dumps(rlprobe.open(a), rlprobe.open(b), CompareOptions(workers=2))
    drop = [c for c in tables["key_data"].column_names if c.startswith("file_")]
    return tables["key_data"].drop_columns(drop).to_pylist()


def test_records_compare_as_whole_files_do(runs):
    packed = _key_data(runs["a"], runs["b"])
    folders = _key_data(runs["a_folders"], runs["b_folders"])
    assert packed == folders
    status = {(r["key"], r["step"], r["micro_step"]): r["status"] for r in packed}
    assert status[("log_prob", 0, 3)] == "mismatch" and status[("log_prob", 0, 2)] == "match"
    assert status[("big", 1, 0)] == "mismatch" and status[("small", 1, 0)] == "match"
    assert status[("half", 1, 5)] == status[("ids", 1, 5)] == "match"
    assert {r["status"] for r in packed} == {"match", "mismatch"}
    # a packed run against the same run written a file a tensor: every element compared equal
    same = _key_data(runs["a"], runs["a_folders"])
    assert {r["status"] for r in same} == {"match"}
    assert all(r["same_pct"] == 100.0 for r in same)


def _write_steps(path: Path, steps: int = 40) -> None:
    rng = np.random.default_rng(1)
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        for step in range(steps):
            old = rng.standard_normal((4, 16)).astype(np.float32) * 0.01 - 1
            mask = np.ones((4, 16), bool)
            mask[:, 12:] = False
            probe.save({"log_prob": old + np.float32(0.3 * (step == 7)), "old_log_prob": old, "response_mask": mask})
            probe.save({"log_prob": old + 0.001, "old_log_prob": old, "response_mask": mask})
            probe.step()


def test_check_reads_records_as_whole_files(tmp_path, monkeypatch):
    from rlprobe.checks import token_batch

    packed, folders = tmp_path / "packed", tmp_path / "folders"
    _write_steps(packed)
    _write_steps(folders)
    unpack(folders)
    compiled = []  # the compiled reads of files took every part (a part they cannot read is read by numpy)
    reduce = token_batch._reduce
    monkeypatch.setattr(token_batch, "_reduce", lambda *a, **k: compiled.append(reduce(*a, **k)) or compiled[-1])
    monkeypatch.setattr(token_batch, "_preload", lambda *a, **k: pytest.fail("a part read by numpy"))
    a, b = check_dump(rlprobe.open(packed)), check_dump(rlprobe.open(folders))
    assert compiled and all(c is not None for c in compiled)
    assert a.results.equals(b.results)
    assert a.rows.keys() == b.rows.keys() and all(a.rows[k].equals(b.rows[k]) for k in a.rows)
    for name, table in a.tables.items():  # repr: NaN (a bucket without tokens) equals NaN
        assert table.schema == b.tables[name].schema and repr(table.to_pylist()) == repr(b.tables[name].to_pylist())
    status = dict(zip(a.results["check"].to_pylist(), a.results["status"].to_pylist()))
    assert status["on_policy"] == "fail"  # step 7's log_prob differs from its old_log_prob
    assert a.tables["token_steps"].num_rows == 40


def test_each_record_reads_back_bit_for_bit(runs, tmp_path):
    dump = rlprobe.open(runs["a"])
    rows = [r for r in dump.key_data().collect().to_dicts() if r["tensor_file"]]
    by_file: dict[str, list[dict]] = {}
    for r in rows:
        by_file.setdefault(r["tensor_file"], []).append(r)
    for file, mine in by_file.items():
        records = pack_records(str(runs["a"] / file))
        assert sorted((r["tensor_offset"], r["tensor_length"]) for r in mine) == [(x.offset, x.length)
                                                                                  for x, _ in records]
    folders = rlprobe.open(runs["a_folders"])
    for r in rows[::7]:
        want = folders.tensor(r["key"], r["step"], micro_step=r["micro_step"], index=r["index"])
        got = dump.tensor(r["key"], r["step"], micro_step=r["micro_step"], index=r["index"])
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), r


def test_a_pack_written_and_read_by_offset(tmp_path):
    pack = TensorPack(str(tmp_path / "call=0.npys"))
    arrays = [np.arange(3, dtype=np.int8), np.zeros((2, 0), np.float32), np.float64(2.5) * np.ones(()),
              np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.array([True, False])]
    places = [pack.save_npy("x", a) for a in arrays]
    assert not (tmp_path / "call=0.npys").exists()  # not in place before commit
    pack.commit()
    assert [p.name for p in tmp_path.iterdir()] == ["call=0.npys"]
    assert all(offset % 64 == 0 for offset, _ in places)
    for (offset, length), a in zip(places, arrays):
        for mmap in (False, True):
            got = load_record(str(tmp_path / "call=0.npys"), Record(offset, length), mmap=mmap)
            assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)
            assert record_layout(str(tmp_path / "call=0.npys"), Record(offset, length)).data_offset % 64 == 0


def _set_column(path: Path, key: str, name: str, value: int) -> None:
    (part,) = (path / "stats" / "key_data" / "rank=0").glob("part-*.parquet")
    table = pq.read_table(part, partitioning=None)
    column = [value if k == key and s == 0 and m == 0 else v for k, s, m, v in
              zip(table["key"].to_pylist(), table["step"].to_pylist(), table["micro_step"].to_pylist(),
                  table[name].to_pylist())]
    table = table.set_column(table.schema.get_field_index(name), name, pa.array(column, pa.int64()))
    pq.write_table(table, part)


@pytest.fixture
def small(tmp_path) -> Path:
    path = tmp_path / "dump"
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        probe.save({"first": np.arange(4, dtype=np.float32), "log_prob": np.arange(100, dtype=np.float32)})
        probe.step()
    return path


def test_an_offset_beyond_the_file_names_file_offset_and_key(small):
    _set_column(small, "log_prob", "tensor_offset", 1 << 20)
    with pytest.raises(DumpReadError, match=r"call=0\.npys at offset 1048576 \(key 'log_prob' step 0 .*beyond the "
                                            r"file's end"):
        rlprobe.open(small).tensor("log_prob", 0)


def test_an_offset_that_is_no_npy_header_names_file_offset_and_key(small):
    _set_column(small, "log_prob", "tensor_offset", 64)  # inside the first record
    with pytest.raises(DumpReadError, match=r"call=0\.npys at offset 64 \(key 'log_prob' step 0.*not a \.npy record"):
        rlprobe.open(small).tensor("log_prob", 0)


def test_a_record_cut_short_names_file_offset_and_key(small):
    rows = rlprobe.open(small).key_data().collect().to_dicts()
    offset = next(r["tensor_offset"] for r in rows if r["key"] == "log_prob")
    _set_column(small, "log_prob", "tensor_length", 200)  # its header describes 128 + 400 bytes
    with pytest.raises(DumpReadError, match=rf"call=0\.npys at offset {offset} \(key 'log_prob'.*truncated \.npy "
                                            r"record: its header describes 528 bytes, 200 are there"):
        rlprobe.open(small).tensor("log_prob", 0)


def test_a_truncated_pack_is_an_error_row_of_compare_naming_file_and_offset(small, tmp_path):
    other = tmp_path / "other"
    with rlprobe.Probe(other, rank=0, world_size=1) as probe:
        probe.save({"first": np.arange(4, dtype=np.float32), "log_prob": np.arange(100, dtype=np.float32)})
        probe.step()
    pack = other / "tensors/key_data/rank=0/steps=0-0.call=0.npys"
    with open(pack, "r+b") as f:
        f.truncate(pack.stat().st_size - 100)
    tables, _ = compare_dumps(rlprobe.open(small), rlprobe.open(other), CompareOptions(workers=1))
    rows = {r["key"]: r for r in tables["key_data"].to_pylist()}
    assert rows["first"]["status"] == "match"
    assert rows["log_prob"]["status"] == "error"
    assert "steps=0-0.call=0.npys at offset 192" in rows["log_prob"]["message"]  # the first record: 144 bytes, padded
    assert "beyond the file's end" in rows["log_prob"]["message"]


def test_the_executor_reads_a_record_and_names_a_bad_one(tmp_path):
    pack = TensorPack(str(tmp_path / "p.npys"))
    places = [pack.save_npy("x", np.full(n, n, np.float32)) for n in (3, 5, 5)]
    pack.commit()
    path = str(tmp_path / "p.npys")
    results = run_pairs([PairTask(0, path, path, Record(*places[1]), Record(*places[2])),
                         PairTask(1, path, path, Record(*places[0]), Record(*places[1])),
                         PairTask(2, path, path, Record(*places[1]), Record(places[2][0] + 16, places[2][1]))],
                        workers=1)
    assert results[0]["equal_count"] == 5
    assert "shape mismatch" in results[1]["error"]
    assert f"p.npys at offset {places[2][0] + 16}" in results[2]["error"]
    assert "not a .npy record" in results[2]["error"]
    with pytest.raises(TensorRecordError):
        load_record(path, Record(places[2][0] + 16, places[2][1]))


@pytest.fixture
def file_size_limit():
    """RLIMIT_FSIZE of 4096 bytes (a full disk, in effect: a write beyond it fails with EFBIG) while the test
    writes; put back before it checks."""
    import resource
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of a signal

    def limit(on: bool) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard) if on else (soft, hard))

    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_a_record_that_fails_half_way_takes_the_pack_with_it(tmp_path, file_size_limit):
    """A large record (written at once) fails: the pack is never renamed into place, later records are refused,
    and no temporary is left, so no row can name a record that is gone."""
    pack = TensorPack(str(tmp_path / "call=0.npys"))
    file_size_limit(True)
    assert pack.save_npy("a", np.zeros(8, np.float32)) == (0, 160)
    with pytest.raises(OSError):
        pack.save_npy("b", np.zeros(PACK_BUFFERED_BELOW // 4, np.float32))
    file_size_limit(False)
    with pytest.raises(OSError, match="an earlier record could not be written"):
        pack.save_npy("c", np.zeros(2, np.float32))
    with pytest.raises(OSError, match=r"call=0\.npys: a record could not be written"):
        pack.commit()
    assert list(tmp_path.iterdir()) == []


def test_small_records_are_written_at_commit_whose_failure_takes_the_pack_with_it(tmp_path, file_size_limit):
    """Small records wait in the pack's buffer and reach the file in one write at commit() (or when the
    buffer fills): the file is not there before; a failed write at commit raises, and nothing is left."""
    pack = TensorPack(str(tmp_path / "call=0.npys"))
    places = [pack.save_npy(str(n), np.full(n, n, np.float32)) for n in (3, 600, 5)]
    assert [p for p in tmp_path.iterdir()][0].stat().st_size == 0  # the hidden temporary, nothing written yet
    pack.commit()
    for n, place in zip((3, 600, 5), places):
        np.testing.assert_array_equal(load_record(str(tmp_path / "call=0.npys"), Record(*place)),
                                      np.full(n, n, np.float32))
    failing = TensorPack(str(tmp_path / "other.npys"))
    file_size_limit(True)
    for n in (3, 1200, 5):  # more than 4,096 bytes: beyond the limit, none written yet
        failing.save_npy(str(n), np.full(n, n, np.float32))
    with pytest.raises(OSError, match=r"other\.npys: a record could not be written"):
        failing.commit()
    file_size_limit(False)
    assert failing.lost is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["call=0.npys"]  # the failed file's temporary is gone
