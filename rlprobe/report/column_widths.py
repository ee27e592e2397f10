"""Column widths of the workbooks: from the header and the content, East Asian wide characters
counted twice (in headers), capped at MAX_WIDTH. Content given as an Arrow array is measured with
pyarrow.compute, as wide as the same values in a list."""

from __future__ import annotations

import unicodedata
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

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
