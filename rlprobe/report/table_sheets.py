"""The table sheets of rlprobe's workbooks (a key's rows in report.xlsx, the extra tables, msprobe's
per-key files): columns as cells, rows filled by status family, the first divergence marked. The
cell formats are registered in tab order by the caller's thread; the cells themselves are made by
each sheet's filler (rlprobe.report.workbook: at once, or on a filler thread beside the next sheets).

Column widths of the workbooks (column_width): from the header and the content, East Asian wide characters
counted twice (in headers), capped at MAX_WIDTH; content given as an Arrow array is measured with
pyarrow.compute, as wide as the same values in a list. And the "Grad similarity" sheet of report.xlsx
(write_grad_matrix): msprobe's similarities.csv as a styled matrix.
"""

from __future__ import annotations

import threading
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

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


MAX_WIDTH = 60
MIN_WIDTH = 6


def display_width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def shown_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def column_width(head: str, values: Sequence[Any] | pa.Array, fmt: str | None) -> float:
    """Column width from the header and the content, capped at MAX_WIDTH."""
    content = _array_content(values, fmt) if isinstance(values, pa.Array) else _list_content(values, fmt)
    # +3 for the autofilter button beside the header
    return float(min(MAX_WIDTH, max(MIN_WIDTH, display_width(head) + 3, content + 2)))


def _list_content(values: Sequence[Any], fmt: str | None) -> int:
    content = 0
    strings = [v for v in values if type(v) is str]
    if strings:
        content = max(map(len, strings))
    if len(strings) < len(values):
        if fmt == "0.0000":
            content = max(content, 9)
        elif fmt == "0.000E+00":
            content = max(content, 10)
        else:
            numbers = [v for v in values if type(v) in (int, float)]
            if any(type(v) is float for v in numbers):
                content = max(content, 11)  # Excel's General shows up to 11 characters
            elif numbers:
                content = max(content, len(str(max(numbers, key=abs))))
    return content


def _array_content(values: pa.Array, fmt: str | None) -> int:
    """_list_content of values.to_pylist(), computed on the array."""
    t = values.type
    if pa.types.is_dictionary(t):
        values, t = values.cast(t.value_type), t.value_type
    text = pa.types.is_string(t) or pa.types.is_large_string(t)
    content = (pc.max(pc.utf8_length(values)).as_py() or 0) if text else 0
    present = len(values) - values.null_count
    if (values.null_count if text else len(values)) == 0:  # only text
        return content
    if fmt == "0.0000":
        return max(content, 9)
    if fmt == "0.000E+00":
        return max(content, 10)
    if pa.types.is_floating(t) and present:
        return max(content, 11)  # Excel's General shows up to 11 characters
    if pa.types.is_integer(t) and present:
        low, high = pc.min_max(values).values()
        return max(content, len(str(max(low.as_py(), high.as_py(), key=abs))))
    return content


MAX_COLUMNS = 16_384  # columns per sheet in Excel


def write_grad_matrix(book: Workbook, name: str, grads: pa.Table, steps: pa.Table, *, lang: str,
                      max_rows: int) -> None:
    """Sign similarity as msprobe's similarities.csv lays it out: a row per (monitor, rank,
    parameter), a column per step, then a "(weighted)" row per (monitor, rank) with the step's
    element-weighted similarity. Flagged cells are red; a parameter missing or reshaped on one
    side shows its status in amber. Numbers are written unstyled (cheap), so a sheet of
    hundreds of parameters x thousands of steps stays a few seconds of openpyxl."""
    rows = grads.select(["monitor", "rank", "step", "param", "status", "similarity", "flagged"]).to_pylist()
    all_steps = sorted({r["step"] for r in rows})
    kept_steps = all_steps[: MAX_COLUMNS - 3]
    column = {s: 3 + i for i, s in enumerate(kept_steps)}
    params: dict[tuple[str, int], dict[str, list[Any]]] = {}
    flags: dict[tuple[str, int, str], dict[int, bool]] = {}  # cell column -> flagged (else: one side only)
    for r in rows:
        group = params.setdefault((r["monitor"], r["rank"]), {})
        cells = group.get(r["param"])
        if cells is None:
            cells = group[r["param"]] = [r["monitor"], r["rank"], r["param"]] + [None] * len(kept_steps)
        j = column.get(r["step"])
        if j is None:
            continue
        if r["similarity"] is not None:
            cells[j] = r["similarity"]
        elif r["status"] not in ("compared", "stats_only"):
            cells[j] = r["status"]
        if r["flagged"] or r["status"] not in ("compared", "stats_only"):
            flags.setdefault((r["monitor"], r["rank"], r["param"]), {})[j] = bool(r["flagged"])
    weighted = {(r["monitor"], r["rank"], r["step"]): r["weighted_similarity"]
                for r in steps.select(["monitor", "rank", "step", "weighted_similarity"]).to_pylist()}
    step_flags = {(r["monitor"], r["rank"], r["step"])
                  for r in steps.select(["monitor", "rank", "step", "flagged"]).to_pylist() if r["flagged"]}
    head = book.style(CellFormat(bold=True, fill=FILLS["header"]))
    bad = book.style(CellFormat(fill=FILLS["bad"]))
    missing = book.style(CellFormat(fill=FILLS["missing"]))
    bold = book.style(CellFormat(bold=True))
    bold_bad = book.style(CellFormat(bold=True, fill=FILLS["bad"]))
    longest = max([len(str(p)) for group in params.values() for p in group] + [12])
    ws = book.add_sheet(name, [12, 6, min(60, longest + 2)] + [9] * len(kept_steps), freeze="D2")
    ws.append([header("monitor", lang), header("rank", lang), header("param", lang), *kept_steps], head)
    written = 0
    for (monitor, rank), group in params.items():
        for param, cells in group.items():
            if written >= max_rows:
                break
            marked = flags.get((monitor, rank, param))
            styles = None
            if marked:
                styles = [None] * len(cells)
                for j, flagged in marked.items():
                    styles[j] = bad if flagged else missing
            ws.append(cells, styles)
            written += 1
        summary_row = [monitor, rank, "(weighted)"] + [weighted.get((monitor, rank, s)) for s in kept_steps]
        styles = [bold] * 3 + [bold_bad if (monitor, rank, s) in step_flags else bold for s in kept_steps]
        ws.append(summary_row, styles)
    total = sum(len(g) for g in params.values())
    notes = []
    if written < total:
        notes.append(f"{written} of {total} parameter rows shown; grads.parquet has all")
    if len(kept_steps) < len(all_steps):
        notes.append(f"steps {kept_steps[0]}-{kept_steps[-1]} of {all_steps[0]}-{all_steps[-1]} shown "
                     "(Excel's column limit); grads.parquet has all")
    if notes:
        ws.blank_row()
        ws.append(["; ".join(notes)], bold)
