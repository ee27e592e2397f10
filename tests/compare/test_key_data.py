"""rlprobe/comparison/key_data.py: the executor's tasks of the pairs tensor_pairs.sql lists, made column by
column, are the tasks made pair by pair from lake/tensor_pack.split_address, whatever the addresses."""

from __future__ import annotations

import pyarrow as pa
import pytest

from rlprobe.comparison.key_data import _pair_tasks, _pair_tasks_one_by_one
from rlprobe.lake.tensor_pack import Record

RECORDS = ["tensors/key_data/step=0/rank=0/call=0.npys#0+1152", "t/x#y/call=1.npys#000128+64"]
WHOLE = ["data/a/step0/rank0/micro_step0/a.npy", "data/b/b.0.npy"]


@pytest.mark.parametrize("file_a, file_b", [
    (RECORDS, RECORDS[::-1]),
    (WHOLE, WHOLE),
    (RECORDS, WHOLE),
    ([RECORDS[0], WHOLE[0]], [RECORDS[1], WHOLE[1]]),  # whole files and records in one column
    (["d/a#b.npy", RECORDS[0]], RECORDS),  # a '#' that is no record's
    (["d/p.npys#1+2+3", RECORDS[0]], RECORDS),  # a length that is no number
    (["d/p.npys#+2", RECORDS[0]], RECORDS),
    (["d/p.npys#1234567890123456789+2", RECORDS[0]], RECORDS),  # past int64's 18 digits
    (["d/p.npys#\u0663+2", RECORDS[0]], RECORDS),  # a digit str.isdigit takes
    (["d/p.npy#1+2", RECORDS[0]], RECORDS),  # not a packed file
])
def test_the_tasks_made_at_once_are_the_tasks_made_one_by_one(file_a, file_b):
    files = pa.table({"file_a": file_a, "file_b": file_b})
    at_once = _pair_tasks(files, "/run/a/", "/run/b/")
    one_by_one = _pair_tasks_one_by_one(files, "/run/a/", "/run/b/")
    assert repr(list(at_once)) == repr(list(one_by_one))
    assert [type(t) for t in at_once] == [type(t) for t in one_by_one]


def test_records_are_split_into_their_file_offset_and_length():
    tasks = _pair_tasks(pa.table({"file_a": RECORDS, "file_b": WHOLE}), "/a/", "/b/")
    assert tasks[1].path_a == "/a/t/x#y/call=1.npys" and tasks[1].record_a == Record(128, 64)
    assert tasks[0].path_b == "/b/" + WHOLE[0] and tasks[0].record_b is None
    assert [t.task_id for t in tasks] == [0, 1]
