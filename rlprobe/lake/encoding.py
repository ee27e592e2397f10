"""Lossless storage of tensors in .npy files.

Raw bytes arrive in a *storage* numpy dtype (bfloat16 as uint16, float8 as uint8). On disk,
low-precision floats are widened exactly to float32, integers shrink to the narrowest integer
dtype that holds their values, and bool stays bool; `restore` turns a file back into the
original integer dtype (or float32 for widened floats) using the dtype in the stats row.
"""

from __future__ import annotations

import numpy as np

from rlprobe.errors import ProbeError

INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
WIDENED_FLOATS = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
NATIVE_FLOATS = ("float32", "float64")
SUPPORTED = ("bool", *INT_DTYPES, *WIDENED_FLOATS, *NATIVE_FLOATS)
_EXACT = float(2 ** 53)  # float64 holds every integer below this exactly (and rounds larger ones to >= it)
# narrowest first; a value range picks the first that holds it
_NARROW_ORDER = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "int64", "uint64")
_NARROW = [(np.dtype(name), int(np.iinfo(name).min), int(np.iinfo(name).max)) for name in _NARROW_ORDER]


def _fp8_table(exp_bits: int, man_bits: int, finite_only: bool) -> np.ndarray:
    """float32 value of each of the 256 bit patterns of an 8-bit float."""
    bias = (1 << (exp_bits - 1)) - 1
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes >> 7, -1.0, 1.0)
    exp = (codes >> man_bits) & ((1 << exp_bits) - 1)
    man = codes & ((1 << man_bits) - 1)
    frac = man / float(1 << man_bits)
    normal = sign * (1.0 + frac) * np.exp2(exp - bias)
    subnormal = sign * frac * np.exp2(1 - bias)
    values = np.where(exp == 0, subnormal, normal)
    top = (1 << exp_bits) - 1
    if finite_only:  # e4m3fn: no infinities, only S.1111.111 is NaN
        values = np.where((exp == top) & (man == (1 << man_bits) - 1), np.nan, values)
    else:  # IEEE-like e5m2
        values = np.where((exp == top) & (man == 0), sign * np.inf, values)
        values = np.where((exp == top) & (man != 0), np.nan, values)
    return values.astype(np.float32)


_FP8 = {"float8_e4m3fn": _fp8_table(4, 3, True), "float8_e5m2": _fp8_table(5, 2, False)}


def storage_dtype(dtype: str) -> np.dtype:
    """The numpy dtype that carries the raw bytes of a logical dtype."""
    if dtype == "bfloat16":
        return np.dtype(np.uint16)
    if dtype in _FP8:
        return np.dtype(np.uint8)
    if dtype in SUPPORTED:
        return np.dtype(dtype)
    raise ProbeError(f"unsupported dtype {dtype!r}; supported: {', '.join(SUPPORTED)}")


def widen(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Numeric values of raw bytes: exact float32 for low-precision floats, else as is."""
    if dtype == "bfloat16":
        # in place on an array copy: `<< 16` of a 0-d array (or a numpy scalar) gives a scalar, int64 under
        # numpy 1.x's casting, whose float32 view fails
        bits = np.array(raw, dtype=np.uint32)
        np.left_shift(bits, np.uint32(16), out=bits)
        return bits.view(np.float32)
    if dtype == "float16":
        return raw.astype(np.float32)
    if dtype in _FP8:
        return _FP8[dtype][raw]
    return raw


def narrow_integers(values: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    """Integers in the narrowest integer dtype that holds [lo, hi]; other arrays unchanged."""
    if values.dtype.kind not in "iu" or values.size == 0 or lo is None or hi is None:
        return values
    if -_EXACT < lo < _EXACT and -_EXACT < hi < _EXACT:  # the float64 statistics are these integers
        lo_i, hi_i = int(lo), int(hi)
    else:  # float statistics lose precision past 2**53
        lo_i, hi_i = int(values.min()), int(values.max())
    for dtype, least, most in _NARROW:
        if least <= lo_i and hi_i <= most:
            return values if dtype.itemsize >= values.dtype.itemsize else values.astype(dtype)
    return values


def restore(stored: np.ndarray, dtype: str | None) -> np.ndarray:
    """The array as the user saved it: original integer dtype; float32 for widened floats."""
    if dtype is None or dtype in WIDENED_FLOATS:
        return stored
    if dtype in INT_DTYPES or dtype == "bool":
        return stored.astype(dtype, copy=False)
    return stored
