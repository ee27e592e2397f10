"""Text built a column at a time with pyarrow.compute, for the report writers that turn whole
tables into file text (xlsx_cells.py, csv_report.py): no Python per cell."""

from __future__ import annotations

from typing import IO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
