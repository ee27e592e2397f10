"""Tensor files mapped for the token kernel read as Dump.load_tensor reads them, and a damaged file
is named in the error."""

from __future__ import annotations

import numpy as np
import pytest

import rlprobe
from rlprobe.check.inputs import stats_table
from rlprobe.check.mapped_tensors import map_tensor
from rlprobe.check.token_tables import tensor_rows
from rlprobe.errors import DumpReadError
from rlprobe.lake.reader import open_dump


def saved(tmp_path, tensors):
    with rlprobe.Probe(tmp_path / "d", flush_interval=0) as p:
        p.save(tensors)
        p.step()
    dump = open_dump(tmp_path / "d")
    return dump, tensor_rows(stats_table(dump))


def test_mapped_tensors_equal_numpy_reads(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"old_log_prob": -rng.random((3, 5), dtype=np.float32), "log_prob": -rng.random((2, 4)),
               "response_mask": rng.random((3, 5)) > 0.5, "advantages": np.asfortranarray(rng.random((4, 3)))}
    dump, rows = saved(tmp_path, tensors)
    assert {k[0] for k in rows} == set(tensors)
    for row in rows.values():
        mapped = map_tensor(dump, row)
        expected = dump.load_tensor(row["tensor_file"], row["dtype"])
        assert mapped.dtype == expected.dtype and mapped.shape == expected.shape
        assert (mapped == expected).all()
        assert not mapped.flags.writeable


def test_truncated_and_damaged_tensor_files_are_named(tmp_path):
    dump, rows = saved(tmp_path, {"old_log_prob": np.ones((64, 64), np.float32)})
    row = next(iter(rows.values()))
    path = dump.path / row["tensor_file"]
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DumpReadError, match=str(path.name)):
        map_tensor(dump, row)
    path.write_bytes(b"not a numpy file")
    with pytest.raises(DumpReadError, match="cannot read tensor"):
        map_tensor(dump, row)
    path.unlink()
    with pytest.raises(DumpReadError, match="cannot read tensor"):
        map_tensor(dump, row)
