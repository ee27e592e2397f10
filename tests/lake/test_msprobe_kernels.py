"""rlprobe/lake/msprobe_kernels.py: the compiled reader of an msprobe dump's folders and statistics files
gives the table Python's reading gives, value for value (floats bit for bit), leaves to Python each file
and each run it cannot read the same way, and every error is still the one Python reports."""

from __future__ import annotations

import json
import math
import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest

from rlprobe.errors import DumpReadError, UnreadEntriesWarning
from rlprobe.lake import msprobe_codes, msprobe_scan
from rlprobe.lake.msprobe_format import compiled_scanner, key_data_table
from tests.lake.test_msprobe_scan import _item, _odd_dump


@pytest.fixture(scope="module")
def scanner():
    """The ahead-of-time copy where built (the command's), else numba's JIT kernel: the same code."""
    found = compiled_scanner()
    if found is not None:
        return found
    from rlprobe.lake.msprobe_kernels import scan_dump

    return scan_dump


def _python(run: Path):
    return key_data_table(run, msprobe_scan.list_tensors(os.fspath(run)))


def _same_table(run: Path, scanner) -> list[dict]:
    compiled = key_data_table(run, scanner=scanner)
    python = _python(run)
    assert compiled.schema == python.schema
    assert repr(compiled.to_pylist()) == repr(python.to_pylist())  # NaN, -0.0 and None as they are
    for name in ("min", "max", "mean", "norm"):  # and every float bit for bit
        assert np.array_equal(compiled[name].to_numpy(zero_copy_only=False).view(np.int64),
                              python[name].to_numpy(zero_copy_only=False).view(np.int64))
    return compiled.to_pylist()


def _statuses(run: Path, scanner) -> tuple[int, list[int]]:
    out = scanner(np.frombuffer(os.fsencode(run), np.uint8))
    return out[0], out[2][:, 3].tolist()


# statistics files as msprobe writes them and as it might: the kernel parses the first group, Python the second
PARSED_TEXTS = [
    '{"data": {"max": 1.5, "min": -2, "mean": 0.0, "norm": 1e-7, "shape": [2, 3]}}',
    '{\n    "data": {\n        "max": NaN,\n        "min": -Infinity,\n        "mean": Infinity,\n'
    '        "norm": -0.0,\n        "shape": []\n    }\n}\n',
    '{"data": {"max": null, "shape": null}}',
    '{"data": {}}',
    ' \t\r\n{"data":{"norm":123456789012345678901234567890,"min":4.9E-324,"max":1e400,"mean":-1E+2}} ',
    '{"data": {"shape": [0, 7], "mean": 0.30000000000000004}}',
]
PYTHON_TEXTS = [
    '{"data": {"max": "0.5", "min": true, "mean": false, "norm": [1]}}',  # text, bools, a list: float() or None
    '{"data": {"max": -0, "shape": [2]}}',  # the integer -0: 0.0 in Python, not -0.0
    '{"data": {"max": 1.0, "max": 2.0}}',  # a key twice: the last one
    '{"data": {"max": 1.0, "dtype": "float32"}}',  # a field msprobe does not write
    '{"data": {"max": 1.0}, "meta": 1}',
    '{"data": 5}',
    '[1, 2]',
    '{"data": {"shape": [2.0, 3]}}',
    '{"data": {"shape": [-1]}}',
    '{"data": {"shape": [4294967296, 1073741825]}}',  # numel past the kernel's bound (2 ** 62)
    '{"data": {"\\u006dax": 3.0}}',
    '{"data": {"max": 1' + "0" * 60 + '}}',  # a number text longer than the kernel takes
]


def _statistics_dump(run: Path, texts: list[str]) -> Path:
    for i, text in enumerate(texts):
        _item(run, "kl", i, 0, "kl", np.zeros((2, 3), np.float32), text)
    _item(run, "kl", len(texts), 0, "kl", np.zeros(4, np.float32), None)  # no statistics file: the npy's shape
    return run


def test_msprobe_s_statistics_files_are_parsed_compiled_and_read_as_python_reads_them(tmp_path: Path, scanner):
    run = _statistics_dump(tmp_path / "run", PARSED_TEXTS)
    status, files = _statuses(run, scanner)
    assert status == 0 and files == [msprobe_codes.PARSED] * len(PARSED_TEXTS) + [msprobe_codes.NO_FILE]
    rows = _same_table(run, scanner)
    assert (rows[0]["max"], rows[0]["min"], rows[0]["shape"], rows[0]["numel"]) == (1.5, -2.0, [2, 3], 6)
    assert math.isnan(rows[1]["max"]) and rows[1]["min"] == -math.inf and rows[1]["mean"] == math.inf
    assert math.copysign(1, rows[1]["norm"]) == -1 and rows[1]["shape"] == [] and rows[1]["numel"] == 1
    assert rows[2]["max"] is None and rows[2]["shape"] == [2, 3]  # shape null: the npy header's
    assert rows[4]["max"] == math.inf and rows[4]["min"] == 5e-324 and rows[4]["norm"] == 1.2345678901234568e29
    assert rows[-1]["shape"] == [4] and rows[-1]["max"] is None


def test_statistics_files_written_otherwise_are_left_to_python(tmp_path: Path, scanner):
    run = _statistics_dump(tmp_path / "run", PYTHON_TEXTS)
    status, files = _statuses(run, scanner)
    assert status == 0 and files == [msprobe_codes.SLOW] * len(PYTHON_TEXTS) + [msprobe_codes.NO_FILE]
    rows = _same_table(run, scanner)
    assert (rows[0]["max"], rows[0]["min"], rows[0]["mean"], rows[0]["norm"]) == (0.5, 1.0, 0.0, None)
    assert rows[1]["max"] == 0.0 and math.copysign(1, rows[1]["max"]) == 1
    assert rows[2]["max"] == 2.0 and rows[10]["max"] == 3.0


def test_the_odd_dump_reads_the_same(tmp_path: Path, scanner):
    run = _odd_dump(tmp_path / "run", unread=False)
    status, files = _statuses(run, scanner)
    assert status == 0 and msprobe_codes.PARSED in files  # its non-ASCII key included
    _same_table(run, scanner)


def test_a_run_holding_entries_it_does_not_read_is_python_s_to_read_and_name(tmp_path: Path, scanner):
    """The compiled reader reads only the micro_step<M>/ layout whole: an entry it does not read anywhere
    under data/ leaves the run to Python, which names it (msprobe_format.unread_entries)."""
    run = _odd_dump(tmp_path / "run")
    assert _statuses(run, scanner)[0] == msprobe_codes.FALLBACK
    with pytest.warns(UnreadEntriesWarning, match=r"2 entries .* data/adv/not-a-step, "
                                                  r"data/adv/step10/rank0/micro_step0/\.hidden\.npy$"):
        assert len(_same_table(run, scanner)) == 6


def test_every_float_is_the_one_python_reads(tmp_path: Path, scanner):
    """Random doubles (every bit pattern), float32 values and decimal texts of up to 25 digits, halfway
    cases included: Arrow's parse of the kernel's texts is correctly rounded, as Python's float()."""
    rng = random.Random(18)
    texts = []
    for i in range(400):
        values = []
        for _ in range(4):
            kind = rng.randrange(4)
            if kind == 0:
                value = repr(struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0])
            elif kind == 1:
                value = repr(struct.unpack("f", struct.pack("I", rng.getrandbits(32)))[0])
            elif kind == 2:
                value = f"{rng.randrange(10 ** rng.randrange(1, 20))}.{rng.randrange(10 ** 6)}e{rng.randrange(-340, 320)}"
            else:
                value = str(rng.randrange(-10 ** 30, 10 ** 30))
            values.append(value.replace("nan", "NaN").replace("inf", "Infinity"))
        texts.append('{"data": {"min": %s, "max": %s, "mean": %s, "norm": %s, "shape": [1]}}' % tuple(values))
    for i, text in enumerate(texts):
        _item(tmp_path / "run", "x", i // 4, i % 4, "x", np.zeros(1, np.float32), text)
    status, files = _statuses(tmp_path / "run", scanner)
    assert status == 0 and files.count(msprobe_codes.PARSED) > 390
    _same_table(tmp_path / "run", scanner)


def _layout_dump(run: Path) -> Path:
    for step in (0, 10, 2):
        for micro in (1, 0):
            _item(run, "adv", step, micro, "adv", np.zeros(2, np.float32), json.dumps({"data": {"max": step}}))
    return run


@pytest.mark.parametrize("odd", ["link", "not_utf8", "unicode_digit", "newline", "file_named_like_a_step",
                                 "folder_of_another_level", "file_in_data", "tensor_without_micro_step"])
def test_a_run_python_might_list_otherwise_is_python_s_to_read(tmp_path: Path, scanner, odd: str):
    run = _layout_dump(tmp_path / "run")
    key = run / "data" / "adv"
    if odd == "file_named_like_a_step":  # no step: named as not read, by Python
        (key / "step7").write_text("")
    elif odd == "folder_of_another_level":
        (key / "rank0").mkdir()
    elif odd == "file_in_data":
        (run / "data" / "notes.txt").write_text("")
    elif odd == "tensor_without_micro_step":  # save_ex without micro_batch: Python reads it as micro-step 0
        np.save(key / "step2" / "rank0" / "adv.npy", np.ones(2, np.float32))
    elif odd == "link":  # Python follows it (is_dir); the listing tells only that it is a link
        os.symlink(key / "step2", key / "step3")
    elif odd == "not_utf8":
        os.mkdir(os.fsencode(key / "step2" / "rank0") + b"/micro_step5\xff")
    elif odd == "unicode_digit":  # \d of Python's pattern matches it
        (key / "step\u0663").mkdir()
    else:
        (key / "step4\n").mkdir()
    status, _ = _statuses(run, scanner)
    assert status == msprobe_codes.FALLBACK
    _same_table(run, scanner)


def test_the_listing_s_order_and_names_are_python_s(tmp_path: Path, scanner):
    run = _layout_dump(tmp_path / "run")
    key = run / "data" / "adv"
    (key / "step01").mkdir()  # the same number as step1 and step001: by number, then name
    (key / "step001").mkdir()
    (key / "step1").mkdir()
    for name in ("step01", "step001", "step1"):
        _item(run, "adv", 0, 0, "adv", np.zeros(1, np.float32), None)
        d = key / name / "rank0" / "micro_step0"
        d.mkdir(parents=True)
        np.save(d / "adv.2.npy", np.zeros(1, np.float32))
        np.save(d / "adv.10.npy", np.zeros(1, np.float32))
        (d / "adv.10.json").write_text('{"data": {"max": 1}}')
        (d / "other.npy").mkdir()  # a folder named like a tensor file is listed as one, as listdir does
    status, _ = _statuses(run, scanner)
    assert status == 0
    rows = _same_table(run, scanner)
    assert [r["tensor_file"].split("/")[2] for r in rows if r["step"] == 1] == ["step001"] * 3 + ["step01"] * 3 + [
        "step1"] * 3
    assert [r["index"] for r in rows if r["step"] == 1][:3] == ["10", "2", "other"]


@pytest.mark.parametrize("content", [b"{not json", b'{"data": {"max": "\xff"}}', b"", b'{"data": {"max": 1.0'])
def test_a_bad_statistics_file_is_named_as_python_names_it(tmp_path: Path, scanner, content: bytes):
    run = _layout_dump(tmp_path / "run")
    bad = run / "data" / "adv" / "step2" / "rank0" / "micro_step1" / "adv.json"
    bad.write_bytes(content)
    with pytest.raises(DumpReadError) as compiled:
        key_data_table(run, scanner=scanner)
    with pytest.raises(DumpReadError) as python:
        _python(run)
    assert str(compiled.value) == str(python.value) and str(bad) in str(compiled.value)


@pytest.mark.timeout(300)  # finishes() fails a reader that waits on a FIFO long before this
@pytest.mark.parametrize("kind", ["a directory", "a FIFO", "a character device"])
def test_a_statistics_file_that_cannot_be_read_is_python_s_error(tmp_path: Path, scanner, kind):
    """Listed, opened (a FIFO without waiting for a writer, lake/regular_files.py), but not read."""
    from tests.lake.fifos import fifo_in_place_of, finishes, zero_device_in_place_of

    run = _layout_dump(tmp_path / "run")
    bad = run / "data" / "adv" / "step10" / "rank0" / "micro_step0" / "adv.json"
    if kind == "a directory":
        bad.unlink()
        bad.mkdir()
    else:
        (fifo_in_place_of if kind == "a FIFO" else zero_device_in_place_of)(bad)
    with pytest.raises(DumpReadError) as compiled:
        finishes(lambda: key_data_table(run, scanner=scanner), [bad])
    with pytest.raises(DumpReadError) as python:
        finishes(lambda: _python(run), [bad])
    assert str(compiled.value) == str(python.value) \
        == f"{bad}: not a regular file ({kind}); expected msprobe's statistics .json file"


@pytest.mark.parametrize("fixture, status", [("keydata", 0), ("keydata_flat", msprobe_codes.FALLBACK),
                                             ("keydata_ids", msprobe_codes.FALLBACK)])
def test_msprobe_s_layouts_read_the_same_compiled_or_not(fixtures_dir, scanner, fixture, status):
    """msprobe's micro_step<M>/ layout stays the compiled reader's; the layouts without micro_step<M>/ it leaves
    to Python (tests/lake/test_msprobe_layouts.py), with the same rows."""
    for run in ("run_a", "run_b"):
        assert _statuses(fixtures_dir / "msprobe" / fixture / run, scanner)[0] == status
        assert len(_same_table(fixtures_dir / "msprobe" / fixture / run, scanner)) == {
            "keydata": 18, "keydata_flat": 21, "keydata_ids": 12}[fixture]
