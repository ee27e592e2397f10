"""The compiled token kernels of the checks, from wherever they are compiled: the ahead-of-time copies where
rlprobe.numba_cache finds the "check" family built (imported without numba: compiled for the JIT's CPU target
with the same flags, so the same bits), else numba's JIT kernels (token_kernel, token_batch_kernel) as before.
numba is imported only on that second path, and only when a kernel is asked for."""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["ROWS_EXPORTS", "batch_kernel", "maxima_kernel", "rows_kernel"]

#: token_kernel.reduce_rows as called from Python (touched=None), by the dtypes of (a, b): the pairs of dtypes
#: the checks pass (log-probs saved as float32 or float64, a side of each); others take the JIT kernel
ROWS_EXPORTS = {(np.dtype(a), np.dtype(b)): f"reduce_rows_{a.__name__}_{b.__name__}"
                for a in (np.float32, np.float64) for b in (np.float32, np.float64)}


def rows_kernel(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> Callable[..., None]:
    """token_kernel.reduce_rows for these (rows, tokens) arrays and a uint8 mask: the ahead-of-time copy for
    C-contiguous arrays of the exported dtypes (it checks neither), numba's JIT kernel for any other."""
    return _for_arrays("reduce_rows", a, b, mask)


def maxima_kernel(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> Callable[..., None]:
    """token_kernel.reduce_maxima for these arrays, chosen as rows_kernel chooses (exported for the same dtypes)."""
    return _for_arrays("reduce_maxima", a, b, mask)


def _for_arrays(kernel: str, a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> Callable[..., None]:
    from rlprobe.numba_cache import compiled_module

    name = ROWS_EXPORTS.get((a.dtype, b.dtype))
    if name is not None and a.flags.c_contiguous and b.flags.c_contiguous and mask.flags.c_contiguous \
            and mask.dtype == np.uint8:
        module = compiled_module("check")
        if module is not None:
            return getattr(module, name.replace("reduce_rows", kernel))
    from rlprobe.checks import token_kernel

    return getattr(token_kernel, kernel)


def batch_kernel() -> Callable[..., tuple[int, int]]:
    """token_batch_kernel.reduce_batch (its arguments as token_batch._reduce passes them): the ahead-of-time
    copy where built, else numba's JIT kernel."""
    from rlprobe.numba_cache import compiled_module

    module = compiled_module("check")
    if module is not None:
        return module.reduce_batch
    from rlprobe.checks.token_batch_kernel import reduce_batch

    return reduce_batch
