"""key_data.csv: every key_data column, headers per language, shapes as "[4, 16]" like msprobe,
formula-like text guarded (rlprobe.report.safe_cells); csv_safe_table guards a table the same
way for other CSV writers."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pyarrow as pa

from rlprobe.report.headers import check_lang, header
from rlprobe.report.output_file import write_report_file
from rlprobe.report.safe_cells import csv_cell, csv_text
from rlprobe.report.comparison_words import list_text

_ROWS_PER_CHUNK = 10_000


def write_key_data_csv(path: str | Path, key_data: pa.Table, lang: str = "en") -> Path:
    """Write `key_data` as CSV, columns in table order. UTF-8 with a BOM for lang="zh", so Excel
    shows the Chinese headers; plain UTF-8 otherwise."""
    check_lang(lang)
    encoding = "utf-8-sig" if lang == "zh" else "utf-8"
    heads = [csv_text(header(c, lang)) for c in key_data.column_names]

    def write(f) -> None:
        text = io.TextIOWrapper(f, encoding=encoding, newline="")
        # RFC 4180 line ends: with "\r\n" as terminator the writer quotes fields holding either character
        writer = csv.writer(text, lineterminator="\r\n")
        writer.writerow(heads)
        for start in range(0, key_data.num_rows, _ROWS_PER_CHUNK):
            chunk = key_data.slice(start, _ROWS_PER_CHUNK)
            writer.writerows(zip(*(_csv_values(chunk.column(c)) for c in chunk.column_names)))
        text.flush()
        text.detach()

    return write_report_file(path, write)


def csv_safe_table(table: pa.Table) -> pa.Table:
    """`table` for another library's CSV writer (pyarrow.csv for `rlprobe sql --format csv`): text
    cells and column names guarded as key_data.csv guards them, lists as "[4, 16]", other nested
    values as JSON text (CSV has no such types); nulls, numbers, booleans and times unchanged."""
    columns = []
    for column in table.columns:
        text = _text_values(column)
        columns.append(column if text is None else pa.array(text, pa.string()))
    return pa.Table.from_arrays(columns, names=[csv_text(n) for n in table.column_names])


def _text_values(column: pa.ChunkedArray) -> list[str | None] | None:
    """A text, list or other nested column as guarded CSV text (None stays None); None for other types."""
    t = column.type
    if pa.types.is_dictionary(t):
        column, t = column.cast(t.value_type), t.value_type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return [None if v is None else csv_text(v) for v in column.to_pylist()]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [None if v is None else csv_text(list_text(v)) for v in column.to_pylist()]
    if pa.types.is_nested(t):
        import json

        return [None if v is None else csv_text(json.dumps(v, ensure_ascii=False, default=str))
                for v in column.to_pylist()]
    return None


def _csv_values(column: pa.ChunkedArray) -> list[Any]:
    text = _text_values(column)
    if text is not None:
        return ["" if v is None else v for v in text]
    t = column.type
    values = column.to_pylist()
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return values  # csv writes None as empty and floats with repr (shortest round-trip)
    return [csv_cell(v) for v in values]
