"""Cell values that spreadsheet programs could run as formulas (formula/CSV injection).

Keys, indices, messages, monitor, parameter, module and stage names and run paths come from
the dumps and the command line, so a key named `=HYPERLINK(...)` must show as text. Every
xlsx and CSV writer of rlprobe stores its cells through the functions here, which depend on
the value only (any spreadsheet library can call them):
- xlsx: `xlsx_cell(value)` is the value to store; a string is always written with the string
  cell type (never a formula), and where `xlsx_quote_prefix(value)` is true also with Excel's
  quote prefix, the mark Excel gives text typed after an apostrophe: the cell shows the text
  unchanged and stays text when someone edits it.
- CSV, which has no types: `csv_cell(value)`; formula-like text gets a leading apostrophe as
  OWASP advises.
Numbers, negative ones included, stay numbers.

Then text built a column at a time with pyarrow.compute (join, literal, write_all), for the report writers that
turn whole tables into file text (xlsx_cells.py, csv_report.py): no Python per cell.
"""

from __future__ import annotations

import math
import re
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
# "-1.5" or "+3e-4" typed into a cell is a number, not a formula: no apostrophe needed
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def is_formula_like(text: str) -> bool:
    """True when a spreadsheet would read `text` as the start of a formula."""
    return text.startswith(FORMULA_TRIGGERS) and not _PLAIN_NUMBER.fullmatch(text)


def csv_text(text: str) -> str:
    """`text` for a CSV cell: prefixed with an apostrophe when it could run as a formula."""
    return "'" + text if is_formula_like(text) else text


def csv_cell(value: Any) -> Any:
    """A value for csv.writer: strings guarded, booleans as true/false, None as empty,
    numbers unchanged."""
    if isinstance(value, str):
        return csv_text(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    return value


MAX_CELL_CHARS = 32_767  # Excel's limit on a cell's text
_TRUNCATED = "… [truncated]"
_EXACT_INT = 2**53  # larger integers lose digits as Excel doubles: they are stored as text
# Characters XML 1.0 cannot carry at all (openpyxl refuses most of them); they become U+FFFD.
_ILLEGAL_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def xlsx_text(text: str) -> str:
    """`text` as an xlsx cell can hold it: within Excel's 32,767 characters (cut text says so),
    characters XML cannot carry replaced by U+FFFD, and CR as LF (XML readers turn CR into LF anyway)."""
    if len(text) > MAX_CELL_CHARS:
        text = text[: MAX_CELL_CHARS - len(_TRUNCATED)] + _TRUNCATED
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _ILLEGAL_XML.sub("\ufffd", text)


def xlsx_cell(value: Any) -> Any:
    """A value as rlprobe's xlsx reports store it: str/int/float/bool/None.

    Excel has no NaN or infinity: those floats become the text 'nan', 'inf', '-inf'; integers
    beyond 2**53 become text so no digit is lost; numpy scalars become Python numbers; other
    objects become their text. Strings must still be written with the string type (never as
    formulas), quote-prefixed where xlsx_quote_prefix says so, as report/xlsx_cells.py writes them
    (guard_openpyxl_cell does it for an openpyxl cell)."""
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else str(value)
    if kind is int:
        return value if -_EXACT_INT <= value <= _EXACT_INT else str(value)
    if kind is str:
        return xlsx_text(value)
    if value is None or kind is bool:
        return value
    if hasattr(value, "item") and not isinstance(value, (list, tuple)):  # numpy scalar
        return xlsx_cell(value.item())
    if isinstance(value, int):
        return xlsx_cell(int(value))
    if isinstance(value, float):
        return xlsx_cell(float(value))
    return xlsx_text(str(value))


def xlsx_quote_prefix(stored: Any) -> bool:
    """Whether the xlsx cell holding `stored` (a value as xlsx_cell returns it) needs Excel's quote
    prefix: text beginning with =, +, -, @ or a tab (CR never remains: xlsx_text makes it LF).
    Unlike CSV's apostrophe the prefix does not show, so text that reads as a number ("-1.5") gets
    it too: Excel keeps it text when the cell is edited."""
    return type(stored) is str and stored.startswith(FORMULA_TRIGGERS)


def guard_openpyxl_cell(cell: Any, value: Any) -> Any:
    """Assign `value` to an openpyxl cell so that formula-like text stays text.

    openpyxl would otherwise turn any string starting with '=' into a formula."""
    cell.value = xlsx_cell(value)
    if isinstance(cell.value, str):
        cell.data_type = "s"
        if xlsx_quote_prefix(cell.value):
            cell.quotePrefix = True
    return cell


NOTHING = pa.scalar("", pa.large_string())


def literal(value: str) -> pa.Scalar:
    return pa.scalar(value, pa.large_string())


def join(*parts: str | pa.Array) -> pa.Array:
    """The parts (texts and large_string arrays) joined row by row; null where any part is null."""
    return pc.binary_join_element_wise(*(literal(p) if isinstance(p, str) else p for p in parts), NOTHING)


def write_all(fileobj: IO[bytes], rows: pa.Array) -> None:
    """Write the strings of `rows` (large_string, no nulls) one after another, UTF-8, from Arrow's buffer."""
    offsets = np.frombuffer(rows.buffers()[1], np.int64)[rows.offset: rows.offset + len(rows) + 1]
    fileobj.write(memoryview(rows.buffers()[2])[offsets[0]: offsets[-1]])
