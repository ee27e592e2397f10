"""The table sheets of rlprobe's workbooks (a key's rows in report.xlsx, the extra tables, msprobe's
per-key files): columns as cells, rows filled by status family, the first divergence marked. The
cell formats are registered in tab order by the caller's thread; the cells themselves are made by
each sheet's filler (rlprobe.report.workbook: at once, or on a filler thread beside the next sheets)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rlprobe.report.column_widths import column_width
from rlprobe.report.comparison_words import list_texts
from rlprobe.report.headers import header, label
from rlprobe.report.workbook import FILLS, MAX_ROWS, CellFormat, Sheet, Workbook
from rlprobe.report.xlsx_cells import column_letter

ROWS_PER_SHEET = MAX_ROWS - 1  # one row is the header

STATUS_FAMILY = {
    "mismatch": "bad", "stats_only_mismatch": "bad", "shape_mismatch": "bad", "dtype_mismatch": "bad",
    "error": "bad", "only_in_a": "missing", "only_in_b": "missing", "absent_in_a": "missing", "absent_in_b": "missing",
    "close": "close", "stats_only_close": "close",  # within rounding (rlprobe/comparison/tolerance.py)
}
FAMILIES = (None, "bad", "missing", "first", "close")


def number_format(column: str) -> str | None:
    """Percentages with 4 decimals, errors in scientific notation, the rest General."""
    if column.endswith("_pct"):
        return "0.0000"
    if column.endswith("_err"):
        return "0.000E+00"
    return None


def write_table_sheets(book: Workbook, sheet_names: Sequence[str], table: pa.Table, lang: str,
                       drop: Sequence[str], order: Sequence[str], note: str | None = None) -> None:
    """One table on one or more sheets (Excel holds 1,048,576 rows a sheet), styled by status;
    columns named in `order` first, the first-divergence marker right after the status; `note`,
    if any, is the last sheet's last row. The cells are made by the sheets' fillers (Workbook)."""
    present = [c for c in table.column_names if c not in drop and c != "is_first_divergence"]
    marks = marks_of(table)
    columns = [c for c in order if c in present] + [c for c in present if c not in order]
    if marks is not None and pc.any(marks).as_py():
        at = columns.index("status") + 1 if "status" in columns else len(columns)
        columns.insert(at, "first_divergence")
    marker = label("first_divergence_marker", lang)
    formats = [number_format(c) for c in columns]
    heads = [header(c, lang) for c in columns]

    def cells() -> tuple[list[pa.Array], pa.Array, list[float]]:
        values = [pc.if_else(marks, marker, None) if c == "first_divergence" else column_values(table, c)
                  for c in columns]
        widths = [column_width(h, vals, fmt) for h, vals, fmt in zip(heads, values, formats)]
        return values, row_families(table, marks), widths

    whole = _Once(cells)  # computed once, by the first sheet's filler, for every sheet of the table
    for part, name in enumerate(sheet_names):
        start, stop = part * ROWS_PER_SHEET, min(table.num_rows, (part + 1) * ROWS_PER_SHEET)

        def rows(start: int = start, stop: int = stop) -> tuple[list[pa.Array], pa.Array, list[float]]:
            values, families, widths = whole()
            return [v[start:stop] for v in values], families[start:stop], widths

        write_grid(book, name, heads, formats, stop - start, rows, note if part == len(sheet_names) - 1 else None)


class _Once:
    """`make()`'s value, made by the first caller (of any thread) and kept."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._value: Any = None
        self._made = False

    def __call__(self) -> Any:
        with self._lock:
            if not self._made:
                self._value, self._made = self._make(), True
                self._make = None  # drop what it held
            return self._value


def write_grid(book: Workbook, name: str, heads: list[str], formats: list[str | None], n_rows: int,
               rows: Callable[[], tuple[list[pa.Array | list[Any]], pa.Array, list[float]]],
               note: str | None = None) -> None:
    """A header row (frozen, with an autofilter) over `n_rows` rows filled by family; then, after an empty
    row, `note` in bold if there is one. `rows()` gives (columns, families, column widths); it runs in
    the sheet's filler (Workbook.add_sheet), after every cell format is registered here."""
    head = book.style(CellFormat(bold=True, fill=FILLS["header"]))
    by_family = [[book.style(CellFormat(bold=fam == "first", fill=FILLS.get(fam), number_format=fmt))
                  for fam in FAMILIES] for fmt in formats]
    bold = book.style(CellFormat(bold=True)) if note is not None else None

    def fill(ws: Sheet) -> None:
        columns, families, widths = rows()
        ws.set_widths(widths)
        ws.append(heads, head)
        ws.append_columns(columns, by_family, families)
        if note is not None:
            ws.blank_row()
            ws.append([note], bold)

    book.add_sheet(name, freeze="A2", autofilter=f"A1:{column_letter(len(heads) - 1)}{n_rows + 1}", fill=fill)


def row_families(table: pa.Table, marks: pa.Array | None) -> pa.Array:
    """Per row, the index into FAMILIES (int32): 0 plain, 1 bad, 2 missing, 3 first divergence, 4 close."""
    families = pa.nulls(table.num_rows, pa.int32())
    if "status" in table.column_names:
        status = table.column("status").combine_chunks()
        if pa.types.is_dictionary(status.type):
            status = status.cast(status.type.value_type)
        at = pc.index_in(status, value_set=pa.array(list(STATUS_FAMILY), status.type))
        families = pc.take(pa.array([FAMILIES.index(f) for f in STATUS_FAMILY.values()], pa.int32()), at)
    families = pc.fill_null(families, 0)
    if marks is not None:
        families = pc.if_else(marks, pa.scalar(3, pa.int32()), families)
    return families


def marks_of(table: pa.Table) -> pa.Array | None:
    """Per row, whether it is the first divergence (is_first_divergence, null as false)."""
    if "is_first_divergence" not in table.column_names:
        return None
    return pc.fill_null(table.column("is_first_divergence").combine_chunks(), False)


def column_values(table: pa.Table, column: str) -> pa.Array:
    """A column as its cells show it: lists as "[4, 16]" text, dictionaries decoded."""
    col = table.column(column).combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    t = col.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return list_texts(col)
    return col
