"""Column widths of the workbooks: from the header and the content, East Asian wide characters
counted twice, capped at MAX_WIDTH."""

from __future__ import annotations

import unicodedata
from typing import Any, Sequence

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


def column_width(head: str, values: Sequence[Any], fmt: str | None) -> float:
    """Column width from the header and the content, capped at MAX_WIDTH."""
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
    # +3 for the autofilter button beside the header
    return float(min(MAX_WIDTH, max(MIN_WIDTH, display_width(head) + 3, content + 2)))
