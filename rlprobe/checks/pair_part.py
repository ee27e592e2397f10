"""What one token-kernel call reads: a pair of tensor rows and the mask's, shared by the pairing by
position (token_tables.py) and by sample (sample_pairs.py)."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np


class Part(NamedTuple):
    """One kernel call: tensor rows a, b and the mask's (None: every token), and which of their
    leading-dimension rows pair up (None: all, in order; a slice: those, split_rows())."""

    pair: str
    a: dict
    b: dict
    mask: dict | None
    a_rows: np.ndarray | slice | None = None
    b_rows: np.ndarray | slice | None = None
    mask_rows: np.ndarray | slice | None = None


def is_float(row: dict[str, Any]) -> bool:
    """A stats row whose dtype is a floating-point one (bf16 and half included)."""
    return float_dtype(row.get("dtype"))


@functools.lru_cache(maxsize=256)
def float_dtype(dtype: str | None) -> bool:
    """A floating-point dtype name (None, a dump that saves no dtype: taken as one)."""
    dtype = (dtype or "float").lower()
    return "float" in dtype or "bf16" in dtype or "half" in dtype or "double" in dtype
