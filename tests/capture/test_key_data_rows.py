"""capture/key_data_rows.py: the key-data rows of a batch of save calls, built as columns.

Each call gets its own rows (absent values first), the host's statistics where the device gave
none and the device's where it did, a null tensor file for values that were not written, and a
tensor whose statistics cannot be worked out is lost alone (recorded, its step incomplete)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np

from rlprobe.capture.key_data_rows import key_data_tables
from rlprobe.capture.calls import LeafJob, SaveCall
from rlprobe.frameworks.base import StagedLeaf
from rlprobe.lake.layout import DumpLayout
from rlprobe.lake.rank_writer import RankWriter
from rlprobe.lake.statistics import bitwise_hash, host_statistics
from rlprobe.lake.tensor_pack import TensorPack, read_tensor_file


def _leaf(values: np.ndarray, **extra) -> StagedLeaf:
    return StagedLeaf(str(values.dtype), values.shape, values, nbytes=values.nbytes, **extra)


def _writer(tmp_path):
    layout = DumpLayout(tmp_path / "dump")
    reported: list[str] = []
    sink = RankWriter(layout, 0, 1, "run", {"framework": "numpy"})
    return SimpleNamespace(sink=sink, report=reported.extend), layout, reported


def test_rows_of_each_call_with_host_and_device_statistics_and_their_records(tmp_path):
    writer, layout, reported = _writer(tmp_path)
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    ids = np.array([3, 900, 2], np.int64)
    device = {"min": -1.0, "max": 2.0, "mean": 0.5, "norm": 3.0, "nan_count": 0, "inf_count": 0, "zero_count": 1}
    partial = np.array([1.5, -2.5, 4.0], np.float64)
    released: list[str] = []
    calls = [
        SaveCall(layout, 4, [LeafJob("x", "", 0, "torch", _leaf(x, release=lambda: released.append("x"))),
                             LeafJob("gone", "", 0, "torch", None),
                             LeafJob("ids", "", 0, "torch", _leaf(ids)),
                             LeafJob("on_device", "", 0, "torch", StagedLeaf("float32", (2, 2), None,
                                                                             device_stats=dict(device))),
                             LeafJob("partial", "a.b", 0, "torch", _leaf(partial, device_stats={"min": -9.0})),
                             LeafJob("empty", "", 0, "torch", _leaf(np.zeros(0, np.float32)))],
                 True, None, 0),
        SaveCall(layout, 5, [LeafJob("x", "", 1, "torch", _leaf(x * 2))], False, None, 1),
    ]
    pack_path = "tensors/key_data/rank=0/steps=4-5.call=0.npys"
    pack = TensorPack(os.path.join(layout.root, pack_path))
    first, second = key_data_tables(writer, calls, pack, pack_path)
    pack.commit()
    assert reported == [] and released == ["x"]
    rows = first.to_pylist()
    assert [r["key"] for r in rows] == ["gone", "x", "ids", "on_device", "partial", "empty"]
    by_key = {r["key"]: r for r in rows}
    assert by_key["gone"]["absent"] and by_key["gone"]["dtype"] is None and by_key["gone"]["min"] is None
    for key, values in (("x", x), ("ids", ids)):
        row = by_key[key]
        assert {name: row[name] for name in host_statistics(values)} == host_statistics(values)
        assert row["hash"] == bitwise_hash(values) and row["shape"] == list(values.shape)
        assert row["numel"] == values.size and row["tensor_file"] == pack_path and row["step"] == 4
        stored = read_tensor_file(str(layout.root / pack_path), row)
        assert np.array_equal(stored, values)
    assert read_tensor_file(str(layout.root / pack_path), by_key["ids"]).dtype == np.uint16  # narrowed by its range
    on_device = by_key["on_device"]
    assert {name: on_device[name] for name in device} == device
    assert on_device["hash"] is None and on_device["tensor_file"] is None and on_device["tensor_offset"] is None
    assert by_key["partial"]["min"] == -9.0 and by_key["partial"]["max"] == 4.0  # the device's win, the host's rest
    assert by_key["partial"]["index"] == "a.b" and by_key["partial"]["mean"] == host_statistics(partial)["mean"]
    empty = by_key["empty"]
    assert empty["min"] is None and empty["mean"] is None and empty["norm"] == 0.0 and empty["numel"] == 0
    (only,) = second.to_pylist()  # statistics only: no record
    assert only["step"] == 5 and only["micro_step"] == 1 and only["max"] == 12.0 and only["tensor_file"] is None


def test_a_tensor_whose_statistics_fail_is_lost_alone(tmp_path):
    writer, layout, reported = _writer(tmp_path)

    def broken() -> None:
        raise RuntimeError("copy from the device failed")

    good = np.ones(4, np.float32)
    calls = [SaveCall(layout, 2, [LeafJob("a", "", 0, None, _leaf(good)),
                                  LeafJob("b", "", 0, None, _leaf(good, finish=broken)),
                                  LeafJob("c", "", 0, None, _leaf(np.array(["x"], object)))], False, None, 0),
             SaveCall(layout, 3, [LeafJob("a", "", 0, None, _leaf(good))], False, None, 1)]
    first, second = key_data_tables(writer, calls, None, None)
    assert first.column("key").to_pylist() == ["a"] and second.column("key").to_pylist() == ["a"]
    assert len(reported) == 2 and all("could not compute statistics" in m for m in reported)
    assert "key 'b' step 2 micro_step 0" in reported[0] and "copy from the device failed" in reported[0]
    assert "key 'c' step 2 micro_step 0" in reported[1]
    lost = writer.sink.manifest["lost"]
    assert [entry["key"] for entry in lost] == ["b", "c"] and writer.sink.manifest["incomplete_steps"] == [2]
