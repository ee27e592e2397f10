"""Key-data tensor files: one folder per save call (issue 15), and dumps in the layout before it.

Readers follow each row's tensor_file, so a dump written with a folder per key, step, rank and
micro step (`tensors/key_data/key=<k>/step=<S>/rank=<R>/micro_step=<M>/<index>.npy`) reads as before.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rlprobe
from rlprobe.compare.kernel_use import may_run_compiled_kernels
from rlprobe.lake.dump_info import dump_info
from rlprobe.lake.layout import safe_component


def _write(path: Path, steps: int = 3, **kw) -> None:
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
    (part,) = (path / "stats" / "key_data" / "rank=0").glob("part-*.parquet")
    table = pq.read_table(part, partitioning=None)
    files = []
    for row in table.to_pylist():
        if row["tensor_file"] is None:
            files.append(None)
            continue
        old = _old_file(row)
        (path / old).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(path / row["tensor_file"], path / old)
        files.append(old)
    at = table.schema.get_field_index("tensor_file")
    pq.write_table(table.set_column(at, "tensor_file", pa.array(files, pa.string())), part)
    for step in (path / "tensors" / "key_data").glob("step=*"):
        shutil.rmtree(step)


def test_a_save_call_is_one_folder_named_after_its_keys(tmp_path):
    path = tmp_path / "dump"
    _write(path)
    dump = rlprobe.open(path)
    rows = dump.key_data().collect().to_dicts()
    files = {(r["key"], r["step"], r["micro_step"], r["index"]): r["tensor_file"] for r in rows}
    assert files[("log_prob", 1, 0, "")] == "tensors/key_data/step=1/rank=0/call=0/log_prob.npy"
    assert files[("pair", 1, 0, "1")] == "tensors/key_data/step=1/rank=0/call=0/pair@1.npy"
    assert files[("cfg", 1, 0, "lr")] == "tensors/key_data/step=1/rank=0/call=0/cfg@lr.npy"
    assert files[("log_prob", 1, 1, "")] == "tensors/key_data/step=1/rank=0/call=1/log_prob.npy"
    assert files[("old_log_prob", 1, 0, "")] is None  # absent: a row, no file
    for step in range(3):
        calls = path / "tensors" / "key_data" / f"step={step}" / "rank=0"
        assert sorted(p.name for p in calls.iterdir()) == ["call=0", "call=1"]  # no temporary left
        assert sorted(p.name for p in (calls / "call=0").iterdir()) == [
            "cfg@lr.npy", "log_prob.npy", "pair@0.npy", "pair@1.npy"]
        np.testing.assert_array_equal(dump.tensor("log_prob", step, micro_step=1), np.full(4, -step, np.float32))
        np.testing.assert_array_equal(dump.tensor("pair", step, index="0"), np.arange(3) * step)
    on_disk = sorted(p.relative_to(path).as_posix() for p in (path / "tensors").rglob("*.npy"))
    assert on_disk == sorted(f for f in files.values() if f)
    assert dump.rank_manifests[0]["tensor_files"] == len(on_disk) == 15
    assert dump.rank_manifests[0]["tensor_bytes"] == sum((path / f).stat().st_size for f in on_disk)


def test_long_and_unsafe_names_make_short_distinct_file_names(tmp_path):
    path = tmp_path / "dump"
    long_key, long_index = "k" * 300, "i" * 300
    with rlprobe.Probe(path, rank=0, world_size=1) as probe:
        probe.save({long_key: {long_index: np.arange(2), long_index + "x": np.arange(3)},
                    "a.b": np.ones(1), "a": {"b": np.zeros(1)}, "x/y": np.full(2, 7)})
    dump = rlprobe.open(path)
    files = {(r["key"], r["index"]): r["tensor_file"] for r in dump.key_data().collect().to_dicts()}
    assert len(set(files.values())) == len(files) == 5
    assert all(len(f.rsplit("/", 1)[1].encode()) < 255 for f in files.values())
    assert files[("a.b", "")].endswith("/a.b.npy") and files[("a", "b")].endswith("/a@b.npy")
    np.testing.assert_array_equal(dump.tensor(long_key, 0, index=long_index + "x"), np.arange(3))
    np.testing.assert_array_equal(dump.tensor("x/y", 0), np.full(2, 7))


def test_a_dump_in_the_layout_before_issue_15_reads_as_before(tmp_path):
    new, old = tmp_path / "new", tmp_path / "old"
    _write(new)
    _write(old)
    _to_old_layout(old)
    assert not list((old / "tensors" / "key_data").glob("step=*"))
    a, b = rlprobe.open(new), rlprobe.open(old)
    rows_b = b.key_data().collect().to_dicts()
    assert any("/micro_step=1/_.npy" in (r["tensor_file"] or "") for r in rows_b)
    for r in rows_b:
        if r["tensor_file"] is not None:
            got = b.tensor(r["key"], r["step"], micro_step=r["micro_step"], index=r["index"])
            want = a.tensor(r["key"], r["step"], micro_step=r["micro_step"], index=r["index"])
            assert got.dtype == want.dtype and np.array_equal(got, want), r
    info_a, info_b = dump_info(a), dump_info(b)
    assert info_a["problems"] == info_b["problems"] == []
    bytes_a = {k["key"]: k["bytes"] for k in info_a["keys"]}
    assert bytes_a == {k["key"]: k["bytes"] for k in info_b["keys"]}
    assert bytes_a["log_prob"] == sum((new / f).stat().st_size
                                      for f in (r["tensor_file"] for r in a.key_data().collect().to_dicts()
                                                if r["key"] == "log_prob"))


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
    assert (path / "tensors" / "key_data" / "step=2" / "rank=0" / "call=0" / "log_prob.npy").is_file()


def test_overwriting_an_old_layout_dump_removes_its_tensors(tmp_path):
    path = tmp_path / "dump"
    _write(path)
    _to_old_layout(path)
    (path / "rank0.json").unlink()  # then the refusal names the data it found
    with pytest.raises(rlprobe.ProbeError, match=r"tensors/key_data/key=\w+/step=\d/rank=0"):
        rlprobe.Probe(path, rank=0, world_size=1)
    _write(path, steps=1, mode="overwrite")
    assert not list((path / "tensors" / "key_data").glob("key=*/step=*/rank=0"))
    assert len(list((path / "tensors").rglob("*.npy"))) == 5


def test_a_hidden_call_folder_is_read_by_no_one(tmp_path):
    """What a writer killed before its rename leaves: a hidden folder, perhaps with whole files in it."""
    path = tmp_path / "dump"
    _write(path, steps=1)
    before = dump_info(rlprobe.open(path))
    hidden = path / "tensors" / "key_data" / "step=0" / "rank=0" / ".call=2.tmp-1234-deadbeef"
    hidden.mkdir()
    for i in range(40):  # more than a small comparison's numpy path takes, each of many elements
        np.save(hidden / f"k{i}.npy", np.zeros(1000, np.float32))
    dump = rlprobe.open(path)
    after = dump_info(dump)
    assert after["keys"] == before["keys"] and after["problems"] == []
    assert may_run_compiled_kernels(dump) is False  # the dump's own 5 tiny files
    np.testing.assert_array_equal(dump.tensor("log_prob", 0), np.arange(6, dtype=np.float32))
