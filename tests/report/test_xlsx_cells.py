"""The cells of rlprobe's workbooks: a whole Arrow column at a time (column_cells) stores every
value as one value at a time does (cell_xml, i.e. safe_cells.xlsx_cell), and a workbook written
in chunks reads back, through openpyxl, value for value, fill for fill."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
import zipfile

import openpyxl
import pyarrow as pa
import pytest

from rlprobe.report import workbook as workbook_module
from rlprobe.report.comparison_words import list_text
from rlprobe.report.workbook import FILLS, CellFormat, Workbook
from rlprobe.report.xlsx_cells import cell_xml, column_cells, column_letter

COLUMNS = {
    "text": (pa.string(), ["plain", "", None, "=1+1", "+x", "-x", "-1.5", "@SUM(1)", "\t=1", "\r=1", "a\r\nb",
                           "x\x00y\x1f", "<b>&amp;</b> \"q\" 'a'", "  padded  ", "中文", "a" * 40_000, "\ufffe"]),
    "large_text": (pa.large_string(), ["=x", None, "ok"]),
    "float": (pa.float64(), [0.0, -0.0, 1.5, -1.5, 1e-5, 1e20, 100.0, float("nan"), float("inf"), float("-inf"),
                             None, 5e-324, 0.1, 1.7976931348623157e308]),
    "float32": (pa.float32(), [0.1, -2.5, None, float("nan"), float("-inf")]),
    "int": (pa.int64(), [0, -1, 2**53, -(2**53), 2**53 + 1, -(2**53) - 1, None, 123]),
    "int8": (pa.int8(), [-128, 127, None]),
    "uint64": (pa.uint64(), [0, 2**53, 2**53 + 1, 2**64 - 1, None]),
    "bool": (pa.bool_(), [True, False, None]),
    "shape": (pa.list_(pa.int64()), [[4, 16], [], None, [2**40]]),
    "float_list": (pa.list_(pa.float64()), [[1.0, 0.5], None]),
    "nulls": (pa.null(), [None, None]),
    "date": (pa.date32(), [None, 0]),
}


def _cell(xml: str):
    """(reference, cell format, type, value) of one cell's XML; numbers as floats."""
    if not xml:
        return None
    el = ET.fromstring(xml.replace("<c ", '<c xmlns:x="urn:x" ', 1))
    kind = el.get("t")
    if kind == "inlineStr":
        t = el.find("is/t")
        assert t.get("{http://www.w3.org/XML/1998/namespace}space") == "preserve"
        value = t.text or ""
    else:
        v = el.find("v")
        value = None if v is None else (float(v.text) if kind is None else v.text)
    assert el.find("f") is None
    return el.get("r"), int(el.get("s", "0")), kind, value


def _python_values(values: pa.Array) -> list:
    t = values.type
    if pa.types.is_dictionary(t):
        values = values.cast(t.value_type)
    if pa.types.is_list(values.type):
        return [None if v is None else list_text(v) for v in values.to_pylist()]
    return values.to_pylist()


@pytest.mark.parametrize("name", list(COLUMNS) + ["dictionary"])
@pytest.mark.parametrize("formats", [(0, 0), (0, 4), (6, 2)])
def test_a_column_at_a_time_stores_what_one_value_at_a_time_stores(name, formats):
    if name == "dictionary":
        values = pa.array(["=k", "k", None, "k", ""]).dictionary_encode()
    else:
        kind, items = COLUMNS[name]
        values = pa.array(items, kind)
    n = len(values)
    families = pa.array([i % 2 for i in range(n)], pa.int32())
    rows = pa.array([str(r) for r in range(7, 7 + n)], pa.large_string())
    got = column_cells("AB", rows, values, formats, families).to_pylist()
    want = [cell_xml(f"AB{r}", v, formats[i % 2])
            for i, (r, v) in enumerate(zip(range(7, 7 + n), _python_values(values)))]
    assert len(got) == n
    for g, w in zip(got, want):
        g, w = _cell(g), _cell(w)
        if g and w and isinstance(w[3], float) and math.isnan(w[3]):
            assert math.isnan(g[3]) and g[:3] == w[:3]
        else:
            assert g == w


def test_formula_like_text_takes_the_quoted_twin_and_nothing_is_a_formula():
    values = pa.array(["=1+1", "-1.5", "safe", "@x", "\tx"])
    got = [_cell(c) for c in column_cells("A", pa.array(list("12345"), pa.large_string()), values, [4],
                                          pa.array([0] * 5, pa.int32())).to_pylist()]
    assert [s for _, s, _, _ in got] == [5, 5, 4, 5, 5]
    assert all(kind == "inlineStr" for _, _, kind, _ in got)


@pytest.mark.parametrize("j, letters", [(0, "A"), (25, "Z"), (26, "AA"), (701, "ZZ"), (702, "AAA"), (16_383, "XFD")])
def test_column_letters(j, letters):
    assert column_letter(j) == letters


def test_a_table_written_in_chunks_reads_back_value_for_value(tmp_path, monkeypatch):
    monkeypatch.setattr(workbook_module, "ROWS_PER_CHUNK", 7)  # many chunks, one of them short
    n = 30
    step = pa.array(range(n), pa.int64())
    err = pa.array([None if i % 5 == 0 else i / 7 for i in range(n)], pa.float64())
    text = pa.array([f"=row {i}" if i % 3 == 0 else f"row {i}" for i in range(n)])
    families = pa.array([i % 3 for i in range(n)], pa.int32())
    path = tmp_path / "t.xlsx"
    with open(path, "wb") as f, Workbook(f) as book:
        fills = [book.style(CellFormat(fill=fill)) for fill in (None, FILLS["bad"], FILLS["missing"])]
        err_fmt = [book.style(CellFormat(fill=fill, number_format="0.000E+00"))
                   for fill in (None, FILLS["bad"], FILLS["missing"])]
        sheet = book.add_sheet("t", [8, 12, 10], freeze="A2", autofilter=f"A1:C{n + 1}")
        sheet.append(["step", "err", "text"], book.style(CellFormat(bold=True)))
        sheet.append_columns([step, err, text], [fills, err_fmt, fills], families)
        sheet.blank_row()
        sheet.append(["note"])
    ws = openpyxl.load_workbook(path)["t"]
    got = [list(r) for r in ws.iter_rows(values_only=True)]
    assert got[0] == ["step", "err", "text"] and got[-1] == ["note", None, None] and len(got) == n + 3
    assert [r[0] for r in got[1:n + 1]] == step.to_pylist()
    assert [r[1] for r in got[1:n + 1]] == err.to_pylist()
    assert [r[2] for r in got[1:n + 1]] == text.to_pylist()
    for i in range(n):
        want = (None, "FFFFC7CE", "FFFFEB9C")[i % 3]
        for c in range(1, 4):
            cell = ws.cell(i + 2, c)
            assert (cell.fill.fgColor.rgb if cell.fill.fill_type == "solid" else None) == want, (i, c)
        assert ws.cell(i + 2, 2).number_format == "0.000E+00"
        assert ws.cell(i + 2, 3).quotePrefix == (i % 3 == 0) and ws.cell(i + 2, 3).data_type == "s"
    assert ws.freeze_panes == "A2" and ws.auto_filter.ref == f"A1:C{n + 1}"
    assert ws.column_dimensions["B"].width == 12
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():  # every part is well-formed XML
            ET.fromstring(z.read(name))
        assert z.read("xl/worksheets/sheet1.xml").count(b"<row ") == n + 2


def test_an_empty_workbook_still_has_a_sheet(tmp_path):
    path = tmp_path / "e.xlsx"
    with open(path, "wb") as f, Workbook(f):
        pass
    assert openpyxl.load_workbook(path).sheetnames == ["Sheet"]


def test_a_failure_inside_the_workbook_leaves_no_temporary_file_open(tmp_path):
    path = tmp_path / "f.xlsx"
    with pytest.raises(RuntimeError, match="boom"):
        with open(path, "wb") as f, Workbook(f) as book:
            sheet = book.add_sheet("s")
            sheet.append([1, 2])
            raise RuntimeError("boom")
    assert sheet._rows.closed


def _many_sheets(path, background: bool) -> None:
    with open(path, "wb") as f, Workbook(f, background=background) as book:
        for s in range(5):
            sheet = book.add_sheet(f"s{s}", [8, 12])
            sheet.append(["sheet", "value"], book.style(CellFormat(bold=True)))
            values = pa.array([s * 1000 + i for i in range(300)], pa.int64())
            sheet.append_columns([pa.array([f"=s{s}"] * 300), values], [[0, 0, 0, 0], [0, 0, 0, 0]],
                                 pa.array([0] * 300, pa.int32()))


def test_sheets_compressed_by_the_background_writer_read_back_in_tab_order(tmp_path):
    """Workbook(background=True): each finished sheet goes into the package on a second thread while
    the next is made; the workbook is the one written in one thread, part for part."""
    one, two = tmp_path / "one.xlsx", tmp_path / "two.xlsx"
    _many_sheets(one, background=False)
    _many_sheets(two, background=True)
    book = openpyxl.load_workbook(two)
    assert book.sheetnames == [f"s{s}" for s in range(5)]
    for s in range(5):
        rows = list(book[f"s{s}"].iter_rows(values_only=True))
        assert rows[0] == ("sheet", "value") and len(rows) == 301
        assert rows[1:] == [(f"=s{s}", s * 1000 + i) for i in range(300)]
    with zipfile.ZipFile(one) as a, zipfile.ZipFile(two) as b:
        assert a.namelist() == b.namelist()
        for name in a.namelist():
            if name != "docProps/core.xml":  # holds the time of writing
                assert a.read(name) == b.read(name), name


def test_a_failure_with_the_background_writer_leaves_no_temporary_file_open(tmp_path):
    path = tmp_path / "f.xlsx"
    with pytest.raises(RuntimeError, match="boom"):
        with open(path, "wb") as f, Workbook(f, background=True) as book:
            first = book.add_sheet("s")
            first.append([1, 2])
            second = book.add_sheet("t")  # the first goes to the writer thread
            second.append([3, 4])
            raise RuntimeError("boom")
    assert first._rows.closed and second._rows.closed


def _filled_sheets(path, fillers: int, fail_at: int | None = None) -> list:
    """Five sheets filled by `fill` functions (on `fillers` threads); sheet `fail_at`'s filler raises."""
    sheets = []
    with open(path, "wb") as f, Workbook(f, fillers=fillers) as book:
        bold = book.style(CellFormat(bold=True))
        for s in range(5):
            def fill(sheet, s=s) -> None:
                if s == fail_at:
                    raise RuntimeError(f"filler {s} failed")
                sheet.set_widths([8, 12])
                sheet.append(["sheet", "value"], bold)
                values = pa.array([s * 1000 + i for i in range(300)], pa.int64())
                sheet.append_columns([pa.array([f"=s{s}"] * 300), values], [[0, 0, 0, 0], [0, 0, 0, 0]],
                                     pa.array([0] * 300, pa.int32()))

            sheets.append(book.add_sheet(f"s{s}", fill=fill))
    return sheets


def test_sheets_filled_on_two_threads_are_the_package_one_thread_writes(tmp_path):
    """Workbook(fillers=2): sheets added with fill= are filled on two threads while the next are added;
    the package takes them in tab order, part for part what the sheets written in one thread make."""
    one, two, three = tmp_path / "one.xlsx", tmp_path / "two.xlsx", tmp_path / "three.xlsx"
    _many_sheets(one, background=False)
    _filled_sheets(two, fillers=1)
    _filled_sheets(three, fillers=2)
    for other in (two, three):
        with zipfile.ZipFile(one) as a, zipfile.ZipFile(other) as b:
            assert a.namelist() == b.namelist()
            for name in a.namelist():
                if name != "docProps/core.xml":  # holds the time of writing
                    assert a.read(name) == b.read(name), (other.name, name)


@pytest.mark.parametrize("fillers", [1, 2])
def test_a_failing_filler_is_raised_and_leaves_no_temporary_file_open(tmp_path, fillers, monkeypatch):
    made = []
    original = Workbook.add_sheet

    def add_sheet(self, *args, **kwargs):
        made.append(original(self, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(Workbook, "add_sheet", add_sheet)
    with pytest.raises(RuntimeError, match="filler 2 failed"):
        _filled_sheets(tmp_path / "f.xlsx", fillers=fillers, fail_at=2)
    assert made and all(sheet._rows.closed for sheet in made)


def test_a_sheet_that_cannot_go_into_the_package_stops_the_sheets_after_it(tmp_path, monkeypatch):
    """Background writer: a sheet whose write into the package fails (a full disk) is raised by the
    workbook; the sheets after it are dropped, not written into the broken package, and closed."""
    from rlprobe.report.workbook import Sheet

    written, made = [], []
    original = Sheet.write_to

    def write_to(self, archive):
        if self._number == 2:
            self.discard()
            raise OSError(28, "No space left on device")
        written.append(self._number)
        original(self, archive)

    monkeypatch.setattr(Sheet, "write_to", write_to)
    with pytest.raises(OSError, match="No space left"):
        with open(tmp_path / "f.xlsx", "wb") as f, Workbook(f, fillers=2) as book:
            for s in range(5):
                made.append(book.add_sheet(f"s{s}", fill=lambda sheet: sheet.append([1, 2])))
    assert written == [1] and all(sheet._rows.closed for sheet in made)
