"""report.xlsx (a Summary sheet, then one sheet per key, then extra tables such as Grads) and
msprobe-style `<key>.xlsx` files, one per key, written by rlprobe.report.workbook.

Table sheets are written a column at a time with pyarrow.compute (about a million cells a
second); still, a key sheet of report.xlsx holds at most `max_sheet_rows` rows (MAX_SHEET_ROWS by
default), so that the workbook stays one people can open: the rows that differ first, then
matching ones, in the table's order; the sheet's last row and the Summary say what was left out,
and key_data.csv / key_data.parquet keep every row. The per-key files hold every row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rlprobe.errors import ProbeError
from rlprobe.lake.layout import safe_component
from rlprobe.report.comparison_words import (MATCHING_STATUSES, cell_text, differs, ordered_counts, rollup_columns,
                                         verdict, yaml_lines)
from rlprobe.report.headers import MSPROBE_LAYOUT, check_lang, header, label, msprobe_headers
from rlprobe.report.markdown import COLUMNS, xlsx_records
from rlprobe.report.output_folder import write_report_file
from rlprobe.report.table_sheets import (MAX_WIDTH, MIN_WIDTH, ROWS_PER_SHEET, STATUS_FAMILY, column_values,
                                         column_width, display_width, marks_of, number_format, row_families,
                                         shown_text, write_grad_matrix, write_grid, write_table_sheets)
from rlprobe.report.workbook import FILLS, MAX_ROWS, CellFormat, SheetNames, Workbook

SUMMARY_SHEET = "Summary"
MAX_SHEET_ROWS = 1_000  # rows of a key sheet in report.xlsx (what a person reads); key_data.csv / .parquet have them all

# Per-key sheet column order; columns not named here follow in table order.
KEY_SHEET_COLUMNS = (
    "step", "rank", "micro_step", "index", "status", "first_divergence", "shape_a", "shape_b", "dtype_a",
    "dtype_b", "numel", "equal_count", "same_pct", "first_mismatch_index", "max_abs_err", "max_rel_err",
    "norm_rel_err", "within_1e3_pct", "within_1e2_pct", "cosine", "nan_mismatch_count", "min_a", "min_b", "max_a", "max_b",
    "mean_a", "mean_b", "norm_a", "norm_b", "nan_count_a", "nan_count_b", "inf_count_a", "inf_count_b",
    "zero_count_a", "zero_count_b", "hash_a", "hash_b", "message",
)
ROLLUP_KEY_COLUMNS = ("key", "sheet", "rows", "match", "matching", "close", "mismatch", "diverging", "other",
                      "only_in_a", "only_in_b", "errors", "first_divergent_step", "max_abs_err", "max_rel_err",
                      "max_norm_rel_err", "rtol", "atol", "tolerance_source", "envelope")
FIRST_DIVERGENCE_FIELDS = ("key", "step", "rank", "micro_step", "index", "status", "max_abs_err", "max_rel_err",
                           "message")
DETAIL_FIELDS = ("created_at", "rlprobe_version", "format_a", "format_b", "pairs_compared", "elapsed_s")


def write_report_xlsx(path: str | Path, key_data: pa.Table, summary: Mapping[str, Any], lang: str = "en",
                      extra_sheets: Mapping[str, pa.Table] | None = None,
                      max_sheet_rows: int = MAX_SHEET_ROWS, extra_files: Mapping[str, str] | None = None,
                      grad_matrix: tuple[pa.Table, pa.Table] | None = None, background: bool = False,
                      fillers: int = 1) -> Path:
    """Write report.xlsx: Summary, one sheet per key (in the summary's key order), then `extra_sheets`,
    then, given `grad_matrix` = (grads, grad_steps), the "Grad similarity" sheet (see grad_matrix_sheet.py).
    `background`: a second thread compresses each finished sheet while the next is made; `fillers` > 1:
    that many threads make the table sheets' cells at once (workbook.py; the same workbook).

    A key sheet holds at most `max_sheet_rows` rows: every row that differs first (the first
    divergence before all), then matching rows, kept in the table's order. Columns without a
    value in any row of `key_data` (dtype, NaN/inf/zero counts and hashes, which msprobe dumps
    do not store) are left off the key sheets; key_data.csv and .parquet keep every column.
    An extra sheet is capped the same way (flagged rows, then rows that differ, first; its last row
    names the file of `extra_files` that has them all) and also leaves off its empty columns."""
    check_lang(lang)
    _require(key_data, ("key",), "key_data")
    if type(max_sheet_rows) is not int or not 1 <= max_sheet_rows <= MAX_ROWS - 3:  # header, empty row, note
        raise ProbeError(f"max_sheet_rows must be a whole number from 1 to {MAX_ROWS - 3}, not {max_sheet_rows!r}")
    extra_sheets = dict(extra_sheets or {})
    names = SheetNames()
    summary_name = names.claim(SUMMARY_SHEET)
    extra_names = {title: names.claim(title) for title in extra_sheets}
    matrix_name = names.claim(GRAD_MATRIX_SHEET) if grad_matrix is not None else None
    empty = _empty_columns(key_data)
    marked = _with_first_marks(key_data, summary.get("first_divergence"))
    groups = _split_by_key(marked, [r.get("key") for r in summary.get("keys") or []], cap=max_sheet_rows)
    key_sheets = {key: names.claim(str(key)) for key in groups}
    shown = {key: table for key, (table, _) in groups.items()}  # key -> the rows its sheet shows
    # key -> (rows shown, rows) where the cap left rows out
    left_out = {key: (table.num_rows, rows) for key, (table, rows) in groups.items() if table.num_rows < rows}

    def write(f) -> None:
        with Workbook(f, background=background, fillers=fillers) as book:
            _write_summary_sheet(book, summary_name, summary, key_sheets, lang, left_out)
            for key, table in shown.items():
                note = _rows_shown(*left_out[key], lang) if key in left_out else None
                write_table_sheets(book, [key_sheets[key]], table, lang, drop=("key", *empty),
                                   order=KEY_SHEET_COLUMNS, note=note)
            for title, table in extra_sheets.items():
                picked = _pick_rows(table, None, max_sheet_rows)
                note = None
                if picked is not None:
                    note = label("rows_shown_in", lang).format(
                        shown=len(picked), total=table.num_rows, file=(extra_files or {}).get(title, "the Parquet file"))
                    table = table.take(picked)
                write_table_sheets(book, [extra_names[title]], table, lang, drop=_empty_columns(table),
                                   order=(), note=note)
            if grad_matrix is not None:
                write_grad_matrix(book, matrix_name, *grad_matrix, lang=lang, max_rows=max_sheet_rows)

    return write_report_file(path, write)


GRAD_MATRIX_SHEET = "Grad similarity"


def _empty_columns(table: pa.Table) -> tuple[str, ...]:
    """Columns without a value in any row (none for an empty table)."""
    return tuple(c for c in table.column_names if table.num_rows and table.column(c).null_count == table.num_rows)


def _pick_rows(table: pa.Table, marks: pa.Array | None, cap: int) -> pa.Array | None:
    """Indices of the rows a capped sheet shows, in table order; None when all fit. The first
    divergence (`marks`, else the table's is_first_divergence) comes first, then flagged rows
    (gradient tables) and the other rows whose status is not a match, then the rest, each in
    table order, until `cap` rows are chosen."""
    if table.num_rows <= cap:
        return None
    if "flagged" in table.column_names:  # gradient rows: the flag, not the status, says what differs
        differ = pc.fill_null(table.column("flagged"), False)
    elif "status" in table.column_names:
        status = table.column("status").combine_chunks()
        if pa.types.is_dictionary(status.type):
            status = status.cast(status.type.value_type)
        matching = pc.is_in(status, value_set=pa.array(sorted(MATCHING_STATUSES)))
        differ = pc.and_(pc.is_valid(status), pc.invert(matching))  # no status: not a difference
    else:
        differ = pa.array([False] * table.num_rows)
    rank = pc.if_else(differ, pa.scalar(1, pa.int8()), pa.scalar(2, pa.int8()))
    marks = marks_of(table) if marks is None else marks
    if marks is not None:
        rank = pc.if_else(marks, pa.scalar(0, pa.int8()), rank)
    chosen = pc.sort_indices(rank).to_numpy()[:cap]  # a stable sort keeps table order per rank
    return pa.array(np.sort(chosen))


def _rows_shown(shown: int, total: int, lang: str) -> str:
    return label("rows_shown", lang).format(shown=shown, total=total)


def write_per_key_xlsx(out_dir: str | Path, key_data: pa.Table, lang: str = "zh") -> dict[str, Path]:
    """msprobe's per-key files: `<key>.xlsx` with step, rank, micro_step, id, shape1, shape2 and its six
    metrics, in its order; return key -> file."""
    check_lang(lang)
    _require(key_data, ("key",) + tuple(column for _, column in MSPROBE_LAYOUT), "key_data")
    out_dir = Path(out_dir)
    heads = msprobe_headers(lang)
    written: dict[str, Path] = {}
    taken: set[str] = set()
    for key, (table, _) in _split_by_key(key_data, []).items():
        stem, n = safe_component(key), 1
        while (stem if n == 1 else f"{stem}~{n}").casefold() in taken:  # case-insensitive file systems
            n += 1
        stem = stem if n == 1 else f"{stem}~{n}"
        taken.add(stem.casefold())
        columns: list[Any] = [column_values(table, column) for _, column in MSPROBE_LAYOUT]
        columns[3] = [_msprobe_id(i) for i in columns[3].to_pylist()]
        families = row_families(table, marks_of(table))
        formats = [number_format(column) for _, column in MSPROBE_LAYOUT]

        def write(f, columns=columns, families=families, formats=formats, n_rows=table.num_rows) -> None:
            widths = [column_width(h, vals, fmt) for h, vals, fmt in zip(heads, columns, formats)]
            with Workbook(f) as book:
                for part, start in enumerate(range(0, max(n_rows, 1), ROWS_PER_SHEET)):
                    stop = min(n_rows, start + ROWS_PER_SHEET)
                    write_grid(book, f"Sheet{part + 1}", heads, formats, stop - start,
                               lambda start=start, stop=stop: ([c[start:stop] for c in columns],
                                                               families[start:stop], widths))

        written[key] = write_report_file(out_dir / f"{stem}.xlsx", write)
    return written


# -- the Summary sheet ------------------------------------------------------------------------
def _write_summary_sheet(book: Workbook, name: str, summary: Mapping[str, Any],
                         key_sheets: Mapping[str, str], lang: str,
                         left_out: Mapping[str, tuple[int, int]]) -> None:
    """The Summary sheet; `left_out` is key -> (rows shown, rows) for key sheets that were capped."""
    style = book.style
    bold = style(CellFormat(bold=True))
    head = style(CellFormat(bold=True, fill=FILLS["header"]))
    rows: list[tuple[list[Any], Any]] = []
    links: dict[int, dict[int, str]] = {}  # row index -> column -> sheet it links to

    def pair(what: str, value: Any, value_style: str | None = None) -> None:
        rows.append(([label(what, lang), value], [bold, value_style]))

    def table(title: str, columns: Sequence[str], records: Sequence[Mapping[str, Any]], family_of) -> None:
        rows.append(([], None))
        rows.append(([label(title, lang)], bold))
        rows.append(([header(c, lang) for c in columns], head))
        for record in records:
            fam = family_of(record)
            rows.append(([cell_text(record.get(c)) for c in columns],
                         [style(CellFormat(fill=FILLS.get(fam), number_format=number_format(c))) for c in columns]))

    rows.append(([label("title", lang)], bold))
    pair("run_a", summary.get("run_a"))
    pair("run_b", summary.get("run_b"))
    first = summary.get("first_divergence")
    pair("verdict", verdict(summary, lang),
         style(CellFormat(bold=True, fill=FILLS["first"] if differs(summary) else None)))
    if first:
        fields = [f for f in FIRST_DIVERGENCE_FIELDS if f in first]
        rows.append(([None] + [header(f, lang) for f in fields], [None] + [head] * len(fields)))
        rows.append(([None] + [first.get(f) for f in fields],
                     [None] + [style(CellFormat(number_format=number_format(f))) for f in fields]))
        if first.get("key") in key_sheets and "key" in fields:
            links[len(rows) - 1] = {1 + fields.index("key"): key_sheets[first["key"]]}
    for what in ("suspect", "advice"):
        if summary.get(what):
            pair(what, summary[what])
    if summary.get("next_config"):
        lines = yaml_lines(summary["next_config"])
        pair("next_config", lines[0])
        rows += [([None, line], None) for line in lines[1:]]
    for what in DETAIL_FIELDS:
        if summary.get(what) is not None:
            pair(what, summary[what])
    for i, (key, (shown, total)) in enumerate(left_out.items()):
        rows.append(([label("rows_left_out", lang) if i == 0 else None, f"{key}: {_rows_shown(shown, total, lang)}"],
                     [bold, style(CellFormat(fill=FILLS["missing"]))]))
    for i, error in enumerate(summary.get("read_errors") or []):
        rows.append(([label("read_errors", lang) if i == 0 else None, str(error)], [bold, style(CellFormat(fill=FILLS["bad"]))]))
    for i, warning in enumerate(summary.get("warnings") or []):  # issue 14: report/markdown.py
        rows.append(([label("warnings", lang) if i == 0 else None, str(warning)], [bold, None]))
    if summary.get("config_diff"):
        table("config_diff", COLUMNS, xlsx_records(summary), lambda r: None)

    table("counts", ["status", "rows"], [{"status": s, "rows": n} for s, n in ordered_counts(summary.get("counts"))],
          lambda r: STATUS_FAMILY.get(r["status"]))
    key_records = [dict(r, sheet=key_sheets.get(r.get("key"))) for r in summary.get("keys") or []]
    key_columns = rollup_columns(key_records, ROLLUP_KEY_COLUMNS)
    table("per_key", key_columns, key_records, _rollup_family)
    if "sheet" in key_columns:
        first_record = len(rows) - len(key_records)
        for i, r in enumerate(key_records):
            if r["sheet"]:
                links[first_record + i] = {key_columns.index("sheet"): r["sheet"]}
    steps = summary.get("steps") or []
    table("per_step", rollup_columns(steps, ("step", "rows")), steps, _rollup_family)
    gates = summary.get("gates") or []
    if gates:
        table("gates", rollup_columns(gates, ("name", "passed", "rows")), gates,
              lambda r: None if r.get("passed", True) else "bad")

    n_cols = max(len(values) for values, _ in rows)
    widths = [float(MIN_WIDTH)] * n_cols
    for values, _ in rows:
        if len(values) == 2 and isinstance(values[1], str) and len(values[1]) > 30:
            values = values[:1]  # prose runs on into the empty cells to its right
        for j, v in enumerate(values):
            widths[j] = max(widths[j], min(MAX_WIDTH, display_width(shown_text(v)) + 2))
    ws = book.add_sheet(name, widths)
    for i, (values, row_style) in enumerate(rows):
        ws.append(values, row_style, links.get(i))


def _rollup_family(record: Mapping[str, Any]) -> str | None:
    bad = any(record.get(c) for c in ("diverging", "mismatch", "other", "errors", "diverged_keys"))
    return "bad" if bad else None


def _with_first_marks(key_data: pa.Table, first: Mapping[str, Any] | None) -> pa.Table:
    """key_data with is_first_divergence: its own, else the rows that summary's first_divergence names."""
    if "is_first_divergence" in key_data.column_names or not first or first.get("key") is None:
        return key_data
    flags = pa.array([True] * key_data.num_rows)
    for field in ("key", "step", "rank", "micro_step", "index"):
        if field in key_data.column_names:
            column, value = key_data.column(field), first.get(field)
            try:
                same = pc.is_null(column) if value is None else pc.fill_null(pc.equal(column, value), False)
            except (pa.ArrowException, TypeError):  # a value of another type matches no row
                same = pa.array([False] * key_data.num_rows)
            flags = pc.and_(flags, same)
    return key_data.append_column("is_first_divergence", flags)


def _split_by_key(table: pa.Table, order: Sequence[Any], cap: int | None = None) -> dict[str, tuple[pa.Table, int]]:
    """key -> (its rows, how many it has), keys in `order` first, then in order of first appearance; row order
    kept. With `cap`, a key of more rows keeps the `cap` that _pick_rows picks: only those rows are copied
    (a copy of every row held the whole table twice while report.xlsx was written: issue 42, item 6)."""
    key = table.column("key").combine_chunks()
    if pa.types.is_dictionary(key.type):
        key = key.cast(key.type.value_type)
    codes = key.dictionary_encode()
    keys = codes.dictionary.to_pylist()  # in order of first appearance
    counts = np.bincount(pc.fill_null(codes.indices, len(keys)).to_numpy(), minlength=len(keys) + 1)
    rows = pc.sort_indices(pc.fill_null(codes.indices, len(keys)))  # stable: table order per key
    starts = np.concatenate([[0], np.cumsum(counts)])
    picking = table.select([c for c in ("flagged", "status", "is_first_divergence") if c in table.column_names])
    groups = {}
    for i, name in enumerate(keys + [None]):
        if not counts[i]:
            continue
        taken = rows.slice(starts[i], counts[i])
        picked = None if cap is None else _pick_rows(picking.take(taken), None, cap)
        groups[name] = (table.take(taken if picked is None else taken.take(picked)), int(counts[i]))
    ranked = [k for k in order if k is not None and k in groups]
    return {key: groups[key] for key in ranked + [k for k in groups if k not in ranked]}


def _msprobe_id(index: Any) -> Any:
    """msprobe's id: 0 for a plain tensor, the list position as a number, dict keys as text."""
    if index in (None, ""):
        return 0
    return int(index) if isinstance(index, str) and index.isdigit() else index


def _require(table: pa.Table, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ProbeError(f"{what} lacks the column(s) {', '.join(missing)}; pass the key_data table "
                         "that `rlprobe compare` writes (key_data.parquet)")
