"""numpy arrays, numpy scalars and Python bool/int/float."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from rlprobe.errors import ProbeError
from rlprobe.frameworks.base import Adapter, StagedLeaf
from rlprobe.lake.encoding import SUPPORTED, WIDENED_FLOATS


class NumpyAdapter(Adapter):
    name = "numpy"

    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, (np.ndarray, np.generic, bool, int, float))

    def as_array(self, value: Any) -> np.ndarray:
        if isinstance(value, bool):
            return np.array(value, dtype=np.bool_)
        if isinstance(value, int):
            if -(1 << 63) <= value < 1 << 63:
                return np.array(value, dtype=np.int64)
            if 0 <= value < 1 << 64:
                return np.array(value, dtype=np.uint64)
            raise ProbeError(f"the int {_short(value)} does not fit in 64 bits (int64 or uint64), the widest integer "
                             "a tensor holds; pass it as a float, or split it")
        if isinstance(value, float):
            return np.array(value, dtype=np.float64)
        return np.asarray(value)

    def dtype_name(self, value: Any) -> str:
        dtype = self.as_array(value).dtype
        name = "bool" if dtype == np.bool_ else dtype.name
        if name not in SUPPORTED:
            raise ProbeError(f"unsupported numpy dtype {dtype}; supported: {', '.join(SUPPORTED)}")
        return name

    def stage(self, values: Sequence[Any], keep_raw: bool) -> list[StagedLeaf]:
        staged = []
        for value in values:
            arr = np.array(self.as_array(value), copy=True, order="C")  # a snapshot, C order
            staged.append(StagedLeaf(self.dtype_name(arr), arr.shape, arr, nbytes=arr.nbytes))
        return staged

    def from_host(self, array: np.ndarray, dtype: str, like: Any) -> Any:
        if dtype in WIDENED_FLOATS and dtype != "float16":
            raise ProbeError(f"numpy has no {dtype}: the baseline's {dtype} tensor can only be replayed into a "
                             "framework tensor (pass a torch tensor of that dtype)")
        out = np.array(array, dtype=np.dtype(dtype), copy=True)  # a copy the caller may change
        if isinstance(like, np.generic) or (isinstance(like, (bool, int, float)) and out.ndim == 0):
            return out[()] if isinstance(like, np.generic) else out.item()
        return out


def _short(value: int) -> str:
    # str() of a huge int is slow, and refused past 4300 digits
    return str(value) if value.bit_length() <= 128 else f"({'-' if value < 0 else ''}{value.bit_length()} bits)"
