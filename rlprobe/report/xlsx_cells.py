"""Cells of rlprobe's xlsx sheets as SpreadsheetML text, stored as rlprobe.report.safe_cells says:
one value at a time (`cell_xml`, for small sheets) or a whole Arrow column at a time
(`column_cells`: pyarrow.compute builds every cell's text, no Python per cell; docs/reports.md).

Text is an inline string (`t="inlineStr"`, never a formula: no cell is ever written with `<f>`),
quote-prefixed where xlsx_quote_prefix says so through the cell format's quoted twin, the xf
index right after it (see workbook.py); an empty string is an empty cell, as openpyxl wrote it.
Numbers are their shortest round-trip text; booleans `t="b"`.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from rlprobe.report.comparison_words import list_texts
from rlprobe.report.safe_cells import (FORMULA_TRIGGERS, MAX_CELL_CHARS, NOTHING, join, literal, xlsx_cell,
                                       xlsx_quote_prefix, xlsx_text)

_EXACT_INT = 2**53  # as safe_cells: larger integers are stored as text
_NEEDS_FIXING = "[\x00-\x08\x0b\x0c\x0e-\x1f\r\ufffe\uffff]"  # what xlsx_text replaces (and CR)
_XML_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_ESCAPE = re.compile("[&<>]")
_FORMULA_START = "^[=+@\t-]"  # FORMULA_TRIGGERS less CR, which never remains (xlsx_text)
_TEXT_OPEN = ' t="inlineStr"><is><t xml:space="preserve">'
_TEXT_CLOSE = "</t></is></c>"
_NO_TEXT = pa.scalar(None, pa.large_string())


def column_letter(j: int) -> str:
    """The letter(s) of the 0-based column `j`: A, ..., Z, AA, ..."""
    letters = ""
    j += 1
    while j:
        j, r = divmod(j - 1, 26)
        letters = chr(65 + r) + letters
    return letters


def escape_xml(text: str) -> str:
    """Text for an XML text node or a double-quoted attribute value."""
    return _ESCAPE.sub(_entity, text).replace('"', "&quot;")


def _entity(match: re.Match[str]) -> str:
    return _XML_ESCAPES[match.group()]


def cell_xml(ref: str, value: Any, style: int) -> str:
    """One cell as xlsx_cell stores `value`, with the cell format `style` (0: the default look);
    "" for an empty cell of the default look, which needs no element."""
    stored = xlsx_cell(value)
    if stored is None or stored == "":
        return f'<c r="{ref}" s="{style}"/>' if style else ""
    if type(stored) is str:
        if xlsx_quote_prefix(stored):
            style += 1
        s = f' s="{style}"' if style else ""
        return f'<c r="{ref}"{s}{_TEXT_OPEN}{_ESCAPE.sub(_entity, stored)}{_TEXT_CLOSE}'
    s = f' s="{style}"' if style else ""
    if type(stored) is bool:
        return f'<c r="{ref}"{s} t="b"><v>{int(stored)}</v></c>'
    return f'<c r="{ref}"{s}><v>{stored!r}</v></c>'


def column_cells(letter: str, rows: pa.Array, values: pa.Array | list[Any], formats: Sequence[int],
                 families: pa.Array) -> pa.Array:
    """Each row's cell of one column, as large_string ("" for an empty cell of the default look).
    `rows`: the row numbers as text; row i has the cell format `formats[families[i]]` (0: the
    default look); `values`: an Arrow array, or a Python list (cells of mixed types) written one
    value at a time."""
    if isinstance(values, list) or not _vectorized(values.type):
        items = values if isinstance(values, list) else values.to_pylist()
        return pa.array([cell_xml(f"{letter}{r}", v, formats[f]) for r, v, f in
                         zip(rows.to_pylist(), items, families.to_pylist())], pa.large_string())
    number, text, flag = _split(values)
    attr = _per_family([f' s="{s}"' if s else "" for s in formats], families)
    cells = []
    if _any(number):
        cells.append(join('<c r="', letter, rows, '"', attr, "><v>", number, "</v></c>"))
    if _any(text):
        quoted = _per_family([f' s="{s + 1}"' for s in formats], families)
        attr_text = pc.if_else(pc.fill_null(_formula_like(text), False), quoted, attr)
        cells.append(join('<c r="', letter, rows, '"', attr_text, _TEXT_OPEN, _escaped(text), _TEXT_CLOSE))
    if _any(flag):
        bit = pc.if_else(flag, literal("1"), literal("0"))
        cells.append(join('<c r="', letter, rows, '"', attr, ' t="b"><v>', bit, "</v></c>"))
    cells = pc.coalesce(*cells) if len(cells) > 1 else cells[0] if cells else pa.nulls(len(rows), pa.large_string())
    if not cells.null_count:
        return cells
    if not any(formats):  # empty cells of the default look need no element
        return pc.fill_null(cells, NOTHING)
    empty = join('<c r="', letter, rows, '"', attr, "/>")
    return pc.coalesce(cells, pc.if_else(pc.equal(attr, ""), NOTHING, empty))


def _per_family(texts: Sequence[str], families: pa.Array) -> pa.Array:
    return pc.take(pa.array(texts, pa.large_string()), families)


def _any(values: pa.Array | None) -> bool:
    return values is not None and values.null_count < len(values)


def _vectorized(t: pa.DataType) -> bool:
    return (pa.types.is_dictionary(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_null(t)
            or pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _split(values: pa.Array) -> tuple[pa.Array | None, pa.Array | None, pa.Array | None]:
    """(number text, stored text, booleans): each null where the row holds something else or nothing."""
    t = values.type
    if pa.types.is_dictionary(t):
        values, t = values.cast(t.value_type), t.value_type
    if pa.types.is_null(t):
        return None, None, None
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        values, t = list_texts(values), None
    if t is None or pa.types.is_string(t) or pa.types.is_large_string(t):
        text = values.cast(pa.large_string())
        if text.offset:  # a slice (a chunk of a sheet): pyarrow < 24's if_else with a null garbles its text
            text = pa.concat_arrays([text])
        return None, _stored_text(pc.if_else(pc.equal(text, ""), _NO_TEXT, text)), None
    if pa.types.is_boolean(t):
        return None, None, values
    if pa.types.is_floating(t):
        values = values.cast(pa.float64())  # a float32 is stored as the double Python reads, as before
        as_text = values.cast(pa.large_string())  # shortest round-trip; nan, inf, -inf as Python writes them
        finite = pc.is_finite(values)
        return pc.if_else(finite, as_text, _NO_TEXT), pc.if_else(finite, _NO_TEXT, as_text), None
    if pa.types.is_unsigned_integer(t):
        values = values.cast(pa.uint64())
        exact = pc.less_equal(values, pa.scalar(_EXACT_INT, pa.uint64()))
    else:
        values = values.cast(pa.int64())
        exact = pc.and_(pc.less_equal(values, _EXACT_INT), pc.greater_equal(values, -_EXACT_INT))
    as_text = values.cast(pa.large_string())
    return pc.if_else(exact, as_text, _NO_TEXT), pc.if_else(exact, _NO_TEXT, as_text), None


def _stored_text(text: pa.Array) -> pa.Array:
    """`text` as xlsx_text stores it: rows with over-long text, CR or characters XML cannot carry
    go through xlsx_text itself (rare); the rest unchanged."""
    odd = pc.or_(pc.match_substring_regex(text, _NEEDS_FIXING), pc.greater(pc.utf8_length(text), MAX_CELL_CHARS))
    if not pc.any(pc.fill_null(odd, False)).as_py():
        return text
    fixed = [v if v is None or not o else xlsx_text(v) for v, o in zip(text.to_pylist(), odd.to_pylist())]
    return pa.array(fixed, pa.large_string())


def _formula_like(text: pa.Array) -> pa.Array:
    """xlsx_quote_prefix of each row."""
    return pc.match_substring_regex(text, _FORMULA_START)


def _escaped(text: pa.Array) -> pa.Array:
    for ch, entity in _XML_ESCAPES.items():
        text = pc.replace_substring(text, ch, entity)  # "&" first: the entities hold one
    return text
