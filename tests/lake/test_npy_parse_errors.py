""".npy headers that numpy's own parser cannot read (rlprobe.lake.npy_header.PARSE_ERRORS): numpy raises
tokenize's TokenError, not a ValueError, for a header such as "{'descr': ('<f4', " (and, on Python >= 3.12,
for one holding a NUL byte). Every reader names the file and says it cannot read it, as for any other
corrupt header; a comparison makes the pair an error row and compares the rest."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from tests.lake.layouts import unpack

import rlprobe
from rlprobe.checks.inputs import stats_table
from rlprobe.checks.token_rows import map_tensor
from rlprobe.checks.token_tables import tensor_rows
from rlprobe.comparison.executor import PairTask, run_pairs
from rlprobe.comparison.npy_files import NpyFile, PairError
from rlprobe.errors import DumpReadError
from rlprobe.lake.npy_header import PARSE_ERRORS
from rlprobe.lake.reader import open_dump
from rlprobe.lake.regular_files import load_npy
from rlprobe.lake.tensor_pack import Record, TensorRecordError, load_record
from rlprobe.pipeline.compare_command import compare

UNCLOSED = b"{'descr': ('<f4', "  # the header's dict never closes: numpy's fallback tokenizer raises TokenError


def bad_npy(header: bytes = UNCLOSED) -> bytes:
    """A version 1.0 .npy file whose header text is `header` (padded as numpy pads), then 32 bytes."""
    text = header + b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + bytes(32)


def test_numpy_raises_a_parser_error_not_a_value_error_for_it():
    # what the readers below must catch: if numpy ever raises a ValueError here, this header tests nothing new
    with pytest.raises(PARSE_ERRORS):
        np.load(io.BytesIO(bad_npy()), allow_pickle=False)


def test_a_pair_s_file_is_named_and_the_pair_is_an_error(tmp_path):
    bad, good = tmp_path / "bad.npy", tmp_path / "good.npy"
    bad.write_bytes(bad_npy())
    np.save(good, np.zeros(8, np.float32))
    for io_kind in ("mmap", "pread"):
        with pytest.raises(PairError, match=f"cannot read {bad}: corrupt or truncated .npy header"):
            NpyFile(str(bad), 0, io_kind)
    results = run_pairs([PairTask(0, str(bad), str(good)), PairTask(1, str(good), str(good))], workers=1)
    assert f"cannot read {bad}" in results[0]["error"] and results[1]["equal_count"] == 8


def test_a_packed_record_is_named_as_not_a_npy_record(tmp_path):
    pack = tmp_path / "p.npys"
    pack.write_bytes(bad_npy())
    with pytest.raises(TensorRecordError, match="p.npys at offset 0.*not a .npy record"):
        load_record(str(pack), Record(0, pack.stat().st_size))


def test_load_npy_raises_a_value_error_naming_the_file(tmp_path):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(bad_npy())
    with pytest.raises(ValueError, match=f"{bad}: corrupt .npy header"):
        load_npy(bad)


def _dump(path: Path, keys: tuple[str, ...]) -> Path:
    with rlprobe.Probe(path, flush_interval=0) as p:
        p.save({key: np.linspace(0, 1, 8, dtype=np.float32) for key in keys})
        p.step()
    return path


def test_rlprobe_check_names_the_tensor_file(tmp_path):
    dump = open_dump(_dump(tmp_path / "d", ("old_log_prob",)))
    unpack(dump.path)
    dump = open_dump(dump.path)
    row = next(iter(tensor_rows(stats_table(dump)).values()))
    (dump.path / row["tensor_file"]).write_bytes(bad_npy())
    with pytest.raises(DumpReadError, match=f"{Path(row['tensor_file']).name}: cannot read tensor"):
        map_tensor(dump, row)


def test_a_comparison_makes_it_an_error_row_naming_the_file_and_compares_the_rest(tmp_path):
    a, b = (_dump(tmp_path / name, ("k1", "k2")) for name in ("a", "b"))
    unpack(b)  # a file a tensor
    files = {r["key"]: b / r["tensor_file"] for r in rlprobe.open(b).arrow("key_data").to_pylist()}
    files["k1"].write_bytes(bad_npy())
    summary = compare(a, b, tmp_path / "out")
    rows = {r["key"]: r for r in summary["keys"]}
    assert summary["counts"] == {"error": 1, "match": 1}, rows
    assert summary["first_divergence"]["key"] == "k1"
    assert os.fspath(files["k1"]) in summary["first_divergence"]["message"]
