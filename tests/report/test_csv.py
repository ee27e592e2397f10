"""key_data.csv: headers per language, msprobe-style shapes, formula-injection guard, round trips."""

from __future__ import annotations

import csv
import io

import pyarrow.csv as pacsv
import pytest

from rlprobe.errors import ProbeError
from rlprobe.report.csv_report import write_key_data_csv
from rlprobe.report.safe_cells import csv_cell, csv_text, guard_openpyxl_cell, is_formula_like, xlsx_cell

from .conftest import KEY_DATA_SCHEMA, key_row, make_key_data


def _read(path, encoding="utf-8") -> list[dict[str, str]]:
    with open(path, encoding=encoding, newline="") as f:
        return list(csv.DictReader(f))


def test_english_csv_round_trips_with_the_csv_module(tmp_path, diverging):
    key_data, _ = diverging
    path = write_key_data_csv(tmp_path / "key_data.csv", key_data)
    assert path.read_bytes()[:3] != b"\xef\xbb\xbf"  # no BOM in English
    rows = _read(path)
    assert list(rows[0]) == ["key", "step", "rank", "micro_step", "index", "status", "shape A", "shape B",
                             "dtype A", "dtype B", "numel", "equal count", "same %", "first mismatch index",
                             "max abs err", "max rel err", "within 1e-3 %", "within 1e-2 %", "cosine",
                             "NaN mismatches", "message", "min A", "min B", "max A", "max B", "mean A", "mean B",
                             "L2 norm A", "L2 norm B", "hash A", "hash B", "first divergence"]
    assert len(rows) == key_data.num_rows
    first = next(r for r in rows if r["first divergence"] == "true")
    assert (first["key"], first["step"], first["micro_step"], first["status"]) == ("log_prob", "1", "1", "mismatch")
    assert first["shape A"] == "[4, 16]" and first["max abs err"] == "4.172350883483887"
    assert first["message"] == "max | rel err high"
    assert first["min A"] == "-1.5"  # a negative number stays a number
    only_b = next(r for r in rows if r["status"] == "only_in_b")
    assert only_b["shape A"] == "" and only_b["same %"] == "" and only_b["first mismatch index"] == ""
    assert sum(r["first divergence"] == "true" for r in rows) == 1


def test_chinese_csv_has_a_bom_and_msprobe_headers(tmp_path, diverging):
    key_data, _ = diverging
    path = write_key_data_csv(tmp_path / "key_data.csv", key_data, lang="zh")
    assert path.read_bytes()[:3] == b"\xef\xbb\xbf"
    header = _read(path, "utf-8-sig")[0]
    for name in ("step", "rank", "micro_step", "id", "shape1", "shape2", "状态", "相同元素百分比(%)",
                 "首个不匹配元素索引", "最大绝对误差", "最大相对误差", "误差在千分之一内元素占比(%)",
                 "误差在百分之一内元素占比(%)"):
        assert name in header


def test_pyarrow_reads_the_numbers_back(tmp_path, diverging):
    key_data, _ = diverging
    path = write_key_data_csv(tmp_path / "key_data.csv", key_data)
    back = pacsv.read_csv(path)
    assert back.num_rows == key_data.num_rows
    assert back.column("step").to_pylist() == key_data.column("step").to_pylist()
    assert back.column("max abs err").to_pylist() == key_data.column("max_abs_err").to_pylist()
    assert back.column("same %").to_pylist() == key_data.column("same_pct").to_pylist()
    assert back.column("first divergence").to_pylist() == key_data.column("is_first_divergence").to_pylist()


def test_formula_like_text_gets_an_apostrophe(tmp_path):
    evil = {"key": "=HYPERLINK(\"http://x\")", "index": "@SUM(1)", "message": "+cmd|' /C calc'!A0",
            "dtype_a": "-2+3", "hash_a": "\t=1", "hash_b": "\r=1"}
    key_data = make_key_data([key_row(status="mismatch", step=0, **evil), key_row("k", 0, index="-1")])
    rows = _read(write_key_data_csv(tmp_path / "k.csv", key_data))
    assert rows[0]["key"] == "'" + evil["key"]
    assert rows[0]["index"] == "'@SUM(1)" and rows[0]["message"] == "'" + evil["message"]
    assert rows[0]["dtype A"] == "'-2+3"
    assert rows[0]["hash A"] == "'\t=1" and rows[0]["hash B"] == "'\r=1"  # the CR is quoted, not a line end
    assert len(rows) == 2
    assert rows[1]["index"] == "-1"  # text that is a plain number cannot run
    assert rows[0]["min A"] == "-1.5"


def test_headers_are_guarded_too(tmp_path):
    table = make_key_data([key_row("k", 0)]).append_column("=evil", [["x"]])
    rows = _read(write_key_data_csv(tmp_path / "k.csv", table))
    assert "'=evil" in rows[0]


def test_bad_language_and_unwritable_path(tmp_path, diverging):
    key_data, _ = diverging
    with pytest.raises(ProbeError, match="language"):
        write_key_data_csv(tmp_path / "k.csv", key_data, lang="de")
    with pytest.raises(ProbeError, match="is a directory"):
        write_key_data_csv(tmp_path, key_data)
    assert list(tmp_path.iterdir()) == []


def test_empty_table_writes_the_header(tmp_path):
    path = write_key_data_csv(tmp_path / "k.csv", KEY_DATA_SCHEMA.empty_table())
    text = path.read_bytes().decode("utf-8")
    assert text.startswith("key,step,rank,") and text.endswith("first divergence\r\n") and text.count("\n") == 1


@pytest.mark.parametrize("text, risky", [
    ("=1+1", True), ("+SUM(A1)", True), ("-cmd", True), ("@x", True), ("\tx", True), ("\rx", True),
    ("-1.5", False), ("+3e-4", False), ("-2+3", True), ("log_prob", False), ("", False), ("a=b", False),
])
def test_is_formula_like(text, risky):
    assert is_formula_like(text) is risky
    assert csv_text(text) == ("'" + text if risky else text)


def test_cell_helpers_keep_numbers_numbers():
    assert csv_cell(-1.5) == -1.5 and csv_cell(-3) == -3 and csv_cell(None) == "" and csv_cell(True) == "true"
    assert xlsx_cell(-1.5) == -1.5 and xlsx_cell(float("-inf")) == "-inf" and xlsx_cell("=x") == "=x"


def test_guard_openpyxl_cell_keeps_text(tmp_path):
    import openpyxl

    wb = openpyxl.Workbook()
    ws = wb.active
    guard_openpyxl_cell(ws["A1"], "=1+1")
    guard_openpyxl_cell(ws["A2"], -2.5)
    buf = io.BytesIO()
    wb.save(buf)
    back = openpyxl.load_workbook(io.BytesIO(buf.getvalue())).active
    assert back["A1"].value == "=1+1" and back["A1"].data_type == "s" and back["A1"].quotePrefix
    assert back["A2"].value == -2.5 and back["A2"].data_type == "n" and not back["A2"].quotePrefix


# -- the rows are built with pyarrow.compute: the bytes must be what csv.writer writes ------------
def _csv_module_bytes(table, lang="en") -> bytes:
    """key_data.csv as Python's csv module writes csv_cell of each value (the writer before issue 18)."""
    from rlprobe.report.comparison_words import list_text
    from rlprobe.report.headers import header

    out = io.StringIO(newline="")
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow([csv_text(header(c, lang)) for c in table.column_names])
    for row in table.to_pylist():
        writer.writerow([csv_cell(list_text(v) if isinstance(v, list) else v) for v in row.values()])
    return out.getvalue().encode()


def test_csv_bytes_are_what_the_csv_module_writes(tmp_path):
    import pyarrow as pa

    rows = [key_row("=k", 0, "mismatch", message='a,b "c"\r\nd', index="-1.5", max_abs_err=1e-05, max_rel_err=1e20,
                    min_a=float("nan"), min_b=float("-inf"), max_a=100.0, max_b=-0.0, mean_a=5e-324,
                    mean_b=123456789012345.6, norm_a=1e15, norm_b=0.0001, hash_a="", hash_b="\t=1"),
            key_row("k", 1, "only_in_b", index="+x", dtype_b="中文", message="@SUM(1)")]
    table = make_key_data(rows)
    table = table.append_column("flag", pa.array([True, None])).append_column("when", pa.array([0, None], pa.date32()))
    table = table.append_column("tag", pa.array(["a", "=b"]).dictionary_encode())
    path = write_key_data_csv(tmp_path / "k.csv", table)
    assert path.read_bytes() == _csv_module_bytes(table)


def test_float_text_is_repr():
    import random

    import pyarrow as pa

    from rlprobe.report.csv_report import float_reprs

    rng = random.Random(18)
    values = [0.0, -0.0, 1e-4, 9.99e-5, 1e15, 999999999999999.9, 1e16, 100.0, -3.0, 5e-324, 2.2250738585072014e-308,
              1.7976931348623157e308, float("nan"), float("inf"), float("-inf"), 0.1, 1 / 3]
    values += [rng.uniform(-1, 1) * 10.0 ** rng.randint(-320, 300) for _ in range(5000)]
    values += [float(rng.randint(-10**17, 10**17)) for _ in range(500)]
    got = float_reprs(pa.array(values + [None], pa.float64())).to_pylist()
    assert got == [repr(v) for v in values] + [None]


def test_key_data_csv_without_a_table_or_its_rendered_file_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"key_data\.csv needs the key_data table or its rendered file"):
        write_key_data_csv(tmp_path / "key_data.csv", None)
    assert not (tmp_path / "key_data.csv").exists()
