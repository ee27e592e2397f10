"""report.xlsx and the msprobe-style per-key files: layout, headers, styling, safety, names."""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

import openpyxl
import pyarrow as pa
import pytest

from rlprobe.errors import ProbeError
from rlprobe.report import table_sheets
from rlprobe.report.headers import msprobe_headers
from rlprobe.report.safe_cells import FORMULA_TRIGGERS
from rlprobe.report.xlsx import write_per_key_xlsx, write_report_xlsx

from .conftest import key_row, make_key_data, make_summary

RED, AMBER, FIRST = "FFFFC7CE", "FFFFEB9C", "FFFF7C80"
EN_KEY_HEADERS = [
    "step", "rank", "micro_step", "index", "status", "first divergence", "shape A", "shape B", "dtype A", "dtype B",
    "numel", "equal count", "same %", "first mismatch index", "max abs err", "max rel err", "within 1e-3 %",
    "within 1e-2 %", "cosine", "NaN mismatches", "min A", "min B", "max A", "max B", "mean A", "mean B",
    "L2 norm A", "L2 norm B", "hash A", "hash B", "message",
]
ZH_KEY_HEADERS = [
    "step", "rank", "micro_step", "id", "状态", "首个分歧", "shape1", "shape2", "dtype1", "dtype2", "元素个数",
    "相同元素个数", "相同元素百分比(%)", "首个不匹配元素索引", "最大绝对误差", "最大相对误差",
    "误差在千分之一内元素占比(%)", "误差在百分之一内元素占比(%)", "余弦相似度", "NaN不匹配个数",
    "最小值1", "最小值2", "最大值1", "最大值2", "均值1", "均值2", "L2范数1", "L2范数2", "哈希1", "哈希2", "说明",
]


def _rows(ws) -> list[list]:
    return [list(r) for r in ws.iter_rows(values_only=True)]


def _fill(cell) -> str | None:
    return cell.fill.fgColor.rgb if cell.fill.fill_type == "solid" else None


def _no_formulas(path: Path) -> None:
    wb = openpyxl.load_workbook(path)
    for ws in wb:
        for row in ws.iter_rows():
            for cell in row:
                assert cell.data_type != "f", (ws.title, cell.coordinate, cell.value)
                if isinstance(cell.value, str) and cell.value.startswith(FORMULA_TRIGGERS):
                    assert cell.quotePrefix, (ws.title, cell.coordinate, cell.value)  # stays text when edited
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            assert b"<f>" not in z.read(name) and b"<f " not in z.read(name), name


def test_summary_sheet_first_then_keys_in_summary_order(tmp_path, diverging):
    key_data, summary = diverging
    path = write_report_xlsx(tmp_path / "report.xlsx", key_data, summary)
    assert path == tmp_path / "report.xlsx"
    wb = openpyxl.load_workbook(path)
    assert wb.sheetnames == ["Summary", "responses", "log_prob", "kl_loss"]
    assert [p.name for p in tmp_path.iterdir()] == ["report.xlsx"]  # no temporary left beside it


@pytest.mark.parametrize("lang, expected", [("en", EN_KEY_HEADERS), ("zh", ZH_KEY_HEADERS)])
def test_key_sheet_headers_per_language(tmp_path, diverging, lang, expected):
    key_data, summary = diverging
    wb = openpyxl.load_workbook(write_report_xlsx(tmp_path / "r.xlsx", key_data, summary, lang=lang))
    assert _rows(wb["log_prob"])[0] == expected
    # a sheet without the first divergence has no marker column
    assert _rows(wb["responses"])[0] == [h for h in expected if h not in ("first divergence", "首个分歧")]


def test_columns_empty_in_every_row_are_left_off_the_key_sheets(tmp_path, diverging):
    """msprobe dumps store no dtype, counts or hashes: those columns would be empty everywhere."""
    key_data, summary = diverging
    for column in ("dtype_a", "dtype_b", "hash_a", "hash_b"):
        key_data = key_data.set_column(key_data.schema.get_field_index(column), column,
                                       pa.nulls(key_data.num_rows, key_data.schema.field(column).type))
    # hash_b has a value in one row only: the column stays
    key_data = key_data.set_column(key_data.schema.get_field_index("hash_b"), "hash_b",
                                   pa.array(["ef" * 16] + [None] * (key_data.num_rows - 1), pa.string()))
    wb = openpyxl.load_workbook(write_report_xlsx(tmp_path / "r.xlsx", key_data, summary))
    expected = [h for h in EN_KEY_HEADERS if h not in ("dtype A", "dtype B", "hash A")]
    assert _rows(wb["log_prob"])[0] == expected
    assert _rows(wb["responses"])[0] == [h for h in expected if h != "first divergence"]


def test_key_sheets_have_frozen_header_autofilter_and_widths(tmp_path, diverging):
    key_data, summary = diverging
    wb = openpyxl.load_workbook(write_report_xlsx(tmp_path / "r.xlsx", key_data, summary))
    ws = wb["log_prob"]
    assert ws.freeze_panes == "A2"
    assert ws.auto_filter.ref == "A1:AE6"  # 31 columns, header + 5 rows
    assert wb["responses"].auto_filter.ref == "A1:AD5"
    widths = {k: d.width for k, d in ws.column_dimensions.items()}
    assert 6 <= widths["A"] <= 60 and widths["AC"] >= 34  # hash column fits its 32 hex digits
    assert all(w <= 60 for w in widths.values())


def test_rows_filled_by_status_and_first_divergence_marked(tmp_path, diverging):
    key_data, summary = diverging
    wb = openpyxl.load_workbook(write_report_xlsx(tmp_path / "r.xlsx", key_data, summary))
    ws = wb["log_prob"]
    rows = _rows(ws)
    status_col = rows[0].index("status") + 1
    by_status = {ws.cell(r, status_col).value: r for r in range(2, ws.max_row + 1)}
    first_row = next(r for r in range(2, ws.max_row + 1) if ws.cell(r, 6).value == "◀ first divergence")
    assert ws.cell(first_row, 5).value == "mismatch" and ws.cell(first_row, 3).value == 1
    assert all(_fill(ws.cell(first_row, c)) == FIRST and ws.cell(first_row, c).font.b for c in range(1, 32))
    assert all(_fill(ws.cell(by_status["shape_mismatch"], c)) == RED for c in range(1, 32))
    assert not ws.cell(by_status["shape_mismatch"], 1).font.b
    assert all(_fill(ws.cell(2, c)) is None for c in range(1, 32))  # a match row stays plain
    kl = wb["kl_loss"]
    assert _fill(kl.cell(2, 1)) == AMBER and _fill(kl.cell(3, 1)) == AMBER  # only_in_a, only_in_b


def test_number_formats(tmp_path, diverging):
    key_data, summary = diverging
    ws = openpyxl.load_workbook(write_report_xlsx(tmp_path / "r.xlsx", key_data, summary))["log_prob"]
    heads = _rows(ws)[0]
    for name, fmt in (("same %", "0.0000"), ("within 1e-3 %", "0.0000"), ("max abs err", "0.000E+00"),
                      ("max rel err", "0.000E+00"), ("cosine", "General"), ("numel", "General")):
        cell = ws.cell(3, heads.index(name) + 1)
        assert cell.number_format == fmt, name
        assert isinstance(cell.value, (int, float))


def test_summary_sheet_tells_the_story(tmp_path, diverging):
    key_data, summary = diverging
    wb = openpyxl.load_workbook(write_report_xlsx(tmp_path / "r.xlsx", key_data, summary))
    ws = wb["Summary"]
    rows = _rows(ws)
    labels = {r[0]: r[1] for r in rows if r[0] is not None}
    assert labels["run A"] == "/runs/gpu" and labels["run B"] == "/runs/npu"
    assert labels["verdict"].startswith("first divergence: 'log_prob', step 1, rank 0, micro_step 1 — mismatch")
    assert labels["suspect"] == summary["suspect"] and labels["advice"] == summary["advice"]
    start = next(i for i, r in enumerate(rows) if r[0] == "next config")
    assert [r[1] for r in rows[start:start + 4]] == ["rlprobe_config:", "  actor_train_dump: true",
                                                     "  step_start: 1", "  step_end: 1"]
    counts = rows.index(["status", "rows"] + [None] * (len(rows[0]) - 2))
    assert rows[counts + 1][:2] == ["match", 7] and rows[counts + 2][:2] == ["mismatch", 1]
    assert rows[counts + 3][:2] == ["shape_mismatch", 1] and _fill(ws.cell(counts + 4, 1)) == RED
    assert _fill(ws.cell(counts + 2, 1)) is None
    per_key = next(i for i, r in enumerate(rows) if r[:2] == ["key", "sheet"])
    assert rows[per_key][:4] == ["key", "sheet", "rows", "match"]
    assert [r[0] for r in rows[per_key + 1:per_key + 4]] == ["responses", "log_prob", "kl_loss"]
    assert _fill(ws.cell(per_key + 3, 1)) == RED and _fill(ws.cell(per_key + 2, 1)) is None
    link = ws.cell(per_key + 3, 2).hyperlink
    assert link is not None and link.location == "'log_prob'!A1"
    per_step = next(i for i, r in enumerate(rows) if r[:3] == ["step", "rows", "diverged keys"])
    assert rows[per_step + 2][:3] == [1, 6, "log_prob, kl_loss"]


def test_summary_sheet_in_chinese(tmp_path, diverging):
    key_data, summary = diverging
    ws = openpyxl.load_workbook(write_report_xlsx(tmp_path / "r.xlsx", key_data, summary, lang="zh"))["Summary"]
    labels = {r[0]: r[1] for r in _rows(ws) if r[0] is not None}
    assert labels["结论"].startswith("首个分歧：'log_prob'")
    assert labels["运行A"] == "/runs/gpu"
    assert any(r[:3] == ["数据名", "工作表", "行数"] for r in _rows(ws))


def test_no_divergence(tmp_path, agreeing):
    key_data, summary = agreeing
    wb = openpyxl.load_workbook(write_report_xlsx(tmp_path / "r.xlsx", key_data, summary))
    labels = {r[0]: r[1] for r in _rows(wb["Summary"]) if r[0] is not None}
    assert labels["verdict"] == "no divergence: every compared value matches"
    assert "first divergence" not in _rows(wb["responses"])[0]
    assert all(_fill(c) is None for row in wb["responses"].iter_rows(min_row=2) for c in row)


def test_formula_like_text_is_written_as_text(tmp_path):
    evil = ["=HYPERLINK(\"http://x\",\"y\")", "+SUM(A1:A2)", "-2+3", "@cmd", "\t=1", "\r=1"]
    rows = [key_row(evil[0], 0, "mismatch", first=True, index="@x", message=evil[1], dtype_a=evil[2]),
            key_row("k", 0, "match", message=evil[3], hash_a=evil[4], hash_b=evil[5])]
    key_data = make_key_data(rows)
    summary = make_summary(key_data, None)
    summary["advice"] = "=cmd|' /C calc'!A0"
    path = write_report_xlsx(tmp_path / "r.xlsx", key_data, summary)
    _no_formulas(path)
    wb = openpyxl.load_workbook(path)
    key_sheet = wb.worksheets[1]
    got = _rows(key_sheet)
    heads = got[0]
    assert got[1][heads.index("index")] == "@x"
    assert got[1][heads.index("message")] == evil[1] and got[1][heads.index("dtype A")] == evil[2]
    assert _rows(wb["k"])[1][heads.index("message") - 1] == evil[3]  # no marker column on this sheet
    assert _rows(wb["k"])[1][heads.index("hash A") - 1] == evil[4]
    # still text; the CR is stored as LF, as every XML reader would read it anyway
    assert _rows(wb["k"])[1][heads.index("hash B") - 1] == "\n=1"
    for row in key_sheet.iter_rows(min_row=2):
        for cell in row:
            if isinstance(cell.value, str):
                assert cell.data_type == "s"
    min_a = key_sheet.cell(2, heads.index("min A") + 1)
    assert min_a.value == -1.5 and min_a.data_type == "n"  # negative numbers stay numbers
    labels = {r[0]: r[1] for r in _rows(wb["Summary"]) if r[0] is not None}
    assert labels["advice"] == summary["advice"]
    assert any(r[0] == evil[0] for r in _rows(wb["Summary"]))


def test_sheet_names_follow_excel_rules(tmp_path):
    keys = ["a/b", "a:b", "x" * 40, "X" * 40, "Summary", "History", "'quoted'", "a[1]*?\\"]
    key_data = make_key_data([key_row(k, 0) for k in keys])
    wb = openpyxl.load_workbook(write_report_xlsx(tmp_path / "r.xlsx", key_data, make_summary(key_data, None)))
    names = wb.sheetnames
    assert names == ["Summary", "a_b", "a_b (2)", "x" * 31, "X" * 27 + " (2)", "Summary (2)", "History_",
                     "quoted", "a_1____"]
    assert len({n.casefold() for n in names}) == len(names)
    assert all(len(n) <= 31 and not set(n) & set("[]:*?/\\") for n in names)
    # the per-key table names each key's sheet
    summary_rows = _rows(wb["Summary"])
    per_key = next(i for i, r in enumerate(summary_rows) if r[:2] == ["key", "sheet"])
    assert [r[:2] for r in summary_rows[per_key + 1:per_key + 1 + len(keys)]] == [[k, n] for k, n in zip(keys, names[1:], strict=True)]


def test_extra_sheets_follow_the_keys(tmp_path, diverging):
    key_data, summary = diverging
    grads = pa.table({"monitor": ["actor", "actor"], "step": [0, 1], "weighted_similarity": [1.0, 0.9],
                      "status": ["match", "mismatch"], "max_abs_err": [0.0, 1e-3]})
    extra = {"Grads": grads, "log_prob": grads}  # a name clash with a key sheet gets a suffix
    wb = openpyxl.load_workbook(write_report_xlsx(tmp_path / "r.xlsx", key_data, summary, extra_sheets=extra))
    assert wb.sheetnames == ["Summary", "responses", "log_prob (2)", "kl_loss", "Grads", "log_prob"]
    ws = wb["Grads"]
    assert _rows(ws) == [["monitor", "step", "weighted_similarity", "status", "max abs err"],
                         ["actor", 0, 1.0, "match", 0.0], ["actor", 1, 0.9, "mismatch", 1e-3]]
    assert ws.freeze_panes == "A2" and ws.auto_filter.ref == "A1:E3"
    assert _fill(ws.cell(3, 1)) == RED and _fill(ws.cell(2, 1)) is None


def test_first_divergence_from_summary_when_the_column_is_missing(tmp_path, diverging):
    key_data, summary = diverging
    ws = openpyxl.load_workbook(write_report_xlsx(
        tmp_path / "r.xlsx", key_data.drop_columns(["is_first_divergence"]), summary))["log_prob"]
    marked = [r for r in _rows(ws)[1:] if r[5] == "◀ first divergence"]
    assert len(marked) == 1 and marked[0][:5] == [1, 0, 1, None, "mismatch"]  # openpyxl writes "" as an empty cell


def test_non_finite_values_become_text(tmp_path):
    key_data = make_key_data([key_row("k", 0, "mismatch", max_abs_err=float("inf"), cosine=float("nan"),
                                      min_a=float("-inf"), numel=2**60)])
    ws = openpyxl.load_workbook(write_report_xlsx(tmp_path / "r.xlsx", key_data, make_summary(key_data, None)))["k"]
    row = dict(zip(_rows(ws)[0], _rows(ws)[1]))
    assert row["max abs err"] == "inf" and row["cosine"] == "nan" and row["min A"] == "-inf"
    assert row["numel"] == str(2**60)  # beyond a double's exact integers: kept exact as text


def test_bad_inputs_raise_probe_errors(tmp_path, diverging):
    key_data, summary = diverging
    with pytest.raises(ProbeError, match="language 'fr'"):
        write_report_xlsx(tmp_path / "r.xlsx", key_data, summary, lang="fr")
    with pytest.raises(ProbeError, match="lacks the column"):
        write_report_xlsx(tmp_path / "r.xlsx", key_data.drop_columns(["key"]), summary)
    (tmp_path / "adir").mkdir()
    with pytest.raises(ProbeError, match="is a directory"):
        write_report_xlsx(tmp_path / "adir", key_data, summary)
    with pytest.raises(ProbeError, match="lacks the column"):
        write_per_key_xlsx(tmp_path / "per_key", key_data.drop_columns(["same_pct"]))


@pytest.mark.parametrize("where", ["write_grid", "column_values"])  # adding a sheet; making its cells
@pytest.mark.parametrize("fillers", [1, 2])
def test_failed_write_keeps_the_previous_report(tmp_path, diverging, monkeypatch, where, fillers):
    """A failure while a sheet is added (the caller's thread) or while its cells are made (a filler
    thread with fillers=2) is raised by write_report_xlsx and leaves the previous report as it was."""
    key_data, summary = diverging
    path = write_report_xlsx(tmp_path / "r.xlsx", key_data, summary)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(table_sheets, where, boom)
    with pytest.raises(RuntimeError, match="killed mid-write"):
        write_report_xlsx(path, key_data, summary, fillers=fillers)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.xlsx"]


def test_sheets_made_by_two_fillers_give_the_same_workbook(tmp_path, diverging):
    """fillers=2 makes the key sheets' cells on two threads: every part of the package is the one a
    single thread writes (styles registered in the same order, sheets in tab order)."""
    key_data, summary = diverging
    one = write_report_xlsx(tmp_path / "one.xlsx", key_data, summary)
    two = write_report_xlsx(tmp_path / "two.xlsx", key_data, summary, fillers=2, background=True)
    with zipfile.ZipFile(one) as a, zipfile.ZipFile(two) as b:
        assert a.namelist() == b.namelist()
        assert len([n for n in a.namelist() if n.startswith("xl/worksheets/")]) == 4  # Summary and three keys
        for name in a.namelist():
            if name != "docProps/core.xml":  # holds the time of writing
                assert a.read(name) == b.read(name), name


def test_per_key_files_have_msprobe_layout(tmp_path, diverging, fixtures_dir):
    key_data, _ = diverging
    files = write_per_key_xlsx(tmp_path / "per_key", key_data)
    assert {k: p.name for k, p in files.items()} == {
        "responses": "responses.xlsx", "log_prob": "log_prob.xlsx", "kl_loss": "kl_loss.xlsx"}
    msprobe = openpyxl.load_workbook(fixtures_dir / "msprobe/keydata/expected/log_prob.xlsx").active
    wb = openpyxl.load_workbook(files["log_prob"])
    ws = wb.active
    assert wb.sheetnames == ["Sheet1"]
    rows = _rows(ws)
    assert rows[0] == _rows(msprobe)[0] == msprobe_headers("zh")
    assert rows[1] == [0, 0, 0, 0, "[4, 16]", "[4, 16]", 100.0, None, 0.0, 0.0, 100.0, 100.0]
    assert rows[4][:7] == [1, 0, 1, 0, "[4, 16]", "[4, 16]", 93.75]  # the first divergence
    assert rows[5][:6] == [1, 0, 1, 0, "[4, 16]", "[4, 8]"]  # list item '0' -> id 0
    assert ws.freeze_panes == "A2" and ws.auto_filter.ref == "A1:L6"
    assert _fill(ws.cell(5, 1)) == FIRST and _fill(ws.cell(6, 1)) == RED
    kl = _rows(openpyxl.load_workbook(files["kl_loss"]).active)
    assert kl[1][4:6] == ["[4, 16]", None]  # only in run A: no shape2


def test_per_key_files_in_english_and_safe_names(tmp_path):
    keys = ["a/b", "../up", "A", "a", "dict.item"]
    key_data = make_key_data([key_row(k, 0, index="logits") for k in keys])
    out = tmp_path / "per_key"
    files = write_per_key_xlsx(out, key_data, lang="en")
    assert set(files) == set(keys)
    assert all(p.parent == out and p.suffix == ".xlsx" and p.is_file() for p in files.values())
    assert len({p.name.casefold() for p in files.values()}) == len(keys)
    assert files["dict.item"].name == "dict.item.xlsx"
    assert not (tmp_path / "up.xlsx").exists()
    rows = _rows(openpyxl.load_workbook(files["a/b"]).active)
    assert rows[0] == ["step", "rank", "micro_step", "id", "shape1", "shape2", "same %", "first mismatch index",
                       "max abs err", "max rel err", "within 1e-3 %", "within 1e-2 %"]
    assert rows[1][3] == "logits"  # a dict item keeps its name as id


def test_fifty_thousand_rows(tmp_path):
    statuses = ["match"] * 6 + ["mismatch", "only_in_a", "shape_mismatch", "stats_only_match"]
    rows = [key_row(f"key{i % 10}", i // 200, statuses[(i // 10) % 10], rank=(i // 10) % 4,
                    micro_step=(i // 40) % 5, message=f"row {i}") for i in range(50_000)]
    rows[120]["is_first_divergence"] = True  # a row with status match, to see that it is kept
    key_data = make_key_data(rows)
    summary = make_summary(key_data, None)
    started = time.perf_counter()
    # a small cap keeps this fast: openpyxl writes about 2,500 such rows a second
    path = write_report_xlsx(tmp_path / "big.xlsx", key_data, summary, max_sheet_rows=200)
    elapsed = time.perf_counter() - started
    print(f"\n50,000-row report.xlsx (200 rows a key sheet) written in {elapsed:.2f} s "
          f"({path.stat().st_size / 1e6:.2f} MB)")
    wb = openpyxl.load_workbook(path)
    assert wb.sheetnames == ["Summary"] + [f"key{i}" for i in range(10)]
    ws = wb["key3"]
    assert ws.max_row == 203 and ws.max_column == 30 and ws.auto_filter.ref == "A1:AD201"
    got = _rows(ws)
    assert got[0][0] == "step" and got[201] == [None] * 30
    assert got[202][0] == "200 of 5000 rows shown; key_data.csv / key_data.parquet have all"
    # key3 has 1,500 rows that differ: the first 200 of them, in order
    differ = [i for i in range(3, 50_000, 10) if statuses[(i // 10) % 10] not in ("match", "stats_only_match")]
    assert [r[-1] for r in got[1:201]] == [f"row {i}" for i in differ[:200]]
    key0 = _rows(wb["key0"])
    assert key0[0][5] == "first divergence"
    marked = [r for r in key0[1:201] if r[5] == "◀ first divergence"]
    assert len(marked) == 1 and marked[0][-1] == "row 120"
    summary_rows = _rows(wb["Summary"])
    notes = [r[1] for r in summary_rows if r[1] and "rows shown" in str(r[1])]
    assert notes == [f"key{i}: 200 of 5000 rows shown; key_data.csv / key_data.parquet have all" for i in range(10)]


def test_key_sheet_cap_keeps_rows_that_differ_then_matching_ones_in_order(tmp_path):
    statuses = ["match", "mismatch", "match", "stats_only_match", "only_in_b", "match"]
    rows = [key_row("big", i // 3, statuses[i % 6], micro_step=i % 3, message=f"row {i}") for i in range(120)]
    rows.append(key_row("small", 0, message="small"))
    key_data = make_key_data(rows)
    summary = make_summary(key_data, None)
    path = write_report_xlsx(tmp_path / "r.xlsx", key_data, summary, max_sheet_rows=50)
    _no_formulas(path)
    wb = openpyxl.load_workbook(path)
    differ = [i for i in range(120) if i % 6 in (1, 4)]  # 40 rows
    same = [i for i in range(120) if i % 6 not in (1, 4)]
    expected = sorted(differ + same[:10])
    ws = wb["big"]
    got = _rows(ws)
    assert len(got) == 1 + 50 + 2 and ws.auto_filter.ref == "A1:AD51" and ws.freeze_panes == "A2"
    heads = got[0]
    assert [r[heads.index("message")] for r in got[1:51]] == [f"row {i}" for i in expected]
    assert [r[:3] for r in got[1:51]] == [[i // 3, 0, i % 3] for i in expected]  # (step, rank, micro_step) order
    assert got[51] == [None] * 30
    assert got[52][0] == "50 of 120 rows shown; key_data.csv / key_data.parquet have all"
    assert ws.cell(53, 1).font.b
    assert _rows(wb["small"]) == _rows(wb["small"])[:2]  # under the cap: no note
    summary_rows = _rows(wb["Summary"])
    assert [r[:2] for r in summary_rows if r[0] == "rows left out"] == [
        ["rows left out", "big: 50 of 120 rows shown; key_data.csv / key_data.parquet have all"]]
    per_key = next(i for i, r in enumerate(summary_rows) if r[:2] == ["key", "sheet"])
    assert summary_rows[per_key + 1][:3] == ["big", "big", 120]  # the roll-up counts every row

    # more rows differ than the cap allows: the first divergence is kept even though it comes last
    key_data = key_data.set_column(key_data.column_names.index("is_first_divergence"), "is_first_divergence",
                                   pa.array([i == 118 for i in range(121)]))
    zh = openpyxl.load_workbook(write_report_xlsx(tmp_path / "zh.xlsx", key_data, summary, lang="zh",
                                                  max_sheet_rows=30))
    got = _rows(zh["big"])
    assert [r[-1] for r in got[1:31]] == [f"row {i}" for i in differ[:29] + [118]]
    assert got[30][5] == "◀ 首个分歧"
    assert got[32][0] == "显示 120 行中的 30 行；完整数据见 key_data.csv / key_data.parquet"
    note = "big: 显示 120 行中的 30 行；完整数据见 key_data.csv / key_data.parquet"
    assert any(r[:2] == ["未全部显示", note] for r in _rows(zh["Summary"]))

    for bad in (0, -1, True, 2.5, 2_000_000):
        with pytest.raises(ProbeError, match="max_sheet_rows"):
            write_report_xlsx(tmp_path / "r.xlsx", key_data, summary, max_sheet_rows=bad)


def test_empty_comparison_has_only_the_summary(tmp_path):
    from .conftest import KEY_DATA_SCHEMA

    key_data = KEY_DATA_SCHEMA.empty_table()
    summary = {"run_a": "a", "run_b": "b", "first_divergence": None, "counts": {}, "keys": [], "steps": [],
               "gates": [{"name": "responses_identical", "passed": True, "rows": 0}]}
    wb = openpyxl.load_workbook(write_report_xlsx(tmp_path / "r.xlsx", key_data, summary))
    assert wb.sheetnames == ["Summary"]
    rows = _rows(wb["Summary"])
    assert ["name", "passed", "rows"] == rows[-2][:3] and rows[-1][:3] == ["responses_identical", True, 0]
    assert write_per_key_xlsx(tmp_path / "per_key", key_data) == {}


def test_extra_sheets_are_capped_flagged_rows_first_and_empty_columns_left_off(tmp_path, diverging):
    key_data, summary = diverging
    n = 50
    grads = pa.table({"step": list(range(n)), "param": [f"p{i % 3}" for i in range(n)],
                      "similarity": [1.0 - i / 100 for i in range(n)],
                      "flagged": [i in (7, 30, 41) for i in range(n)], "message": pa.nulls(n, pa.string())})
    path = write_report_xlsx(tmp_path / "r.xlsx", key_data, summary, extra_sheets={"Grad params": grads},
                             max_sheet_rows=5, extra_files={"Grad params": "grads.parquet"})
    rows = _rows(openpyxl.load_workbook(path)["Grad params"])
    assert rows[0] == ["step", "param", "similarity", "flagged"]  # "message" is empty in every row
    assert [r[0] for r in rows[1:6]] == [0, 1, 7, 30, 41]  # the flagged rows, then the first others, in order
    assert rows[-1][0] == "5 of 50 rows shown (flagged and differing rows first); grads.parquet has all"
    small = write_report_xlsx(tmp_path / "s.xlsx", key_data, summary, extra_sheets={"Grad params": grads})
    assert len(_rows(openpyxl.load_workbook(small)["Grad params"])) == n + 1  # under the cap: every row, no note


def test_a_capped_sheet_shows_the_first_divergence_then_rows_that_differ_in_table_order():
    from rlprobe.report.xlsx import _pick_rows

    status = pa.array([None, "match", "mismatch", "only_in_a", "match", "mismatch"]).dictionary_encode()
    table = pa.table({"status": status, "is_first_divergence": [False, False, False, False, False, True]})
    assert _pick_rows(table, None, 6) is None
    assert _pick_rows(table, None, 3).to_pylist() == [2, 3, 5]  # a row without a status does not differ
    assert _pick_rows(table, None, 1).to_pylist() == [5]
    assert _pick_rows(table, None, 4).to_pylist() == [0, 2, 3, 5]
    grads = pa.table({"status": ["compared"] * 3, "flagged": [None, True, False]})
    assert _pick_rows(grads, None, 1).to_pylist() == [1]
