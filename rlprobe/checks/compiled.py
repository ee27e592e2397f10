"""The compiled token kernels of the checks, from wherever they are compiled: the ahead-of-time copies where
rlprobe.numba_cache finds the "check" family built (imported without numba: compiled for the JIT's CPU target
with the same flags, so the same bits), else numba's JIT kernels (token_kernel, token_batch_kernel) as before.
numba is imported only on that second path, and only when a kernel is asked for. reduce_pair is the token
kernel's Python face: one pair of per-token log-prob tensors reduced into the figures of token_figures.py."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from rlprobe.checks.token_figures import LOG_THRESHOLDS, PROBABILITY_OF, PairFigures, as_rows, check_shapes, mask_bytes

__all__ = ["ROWS_EXPORTS", "batch_kernel", "maxima_kernel", "reduce_pair", "rows_kernel"]

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


def reduce_pair(a: np.ndarray, b: np.ndarray, eps: float, mask: np.ndarray | None = None,
                into: PairFigures | None = None) -> tuple[PairFigures, np.ndarray, np.ndarray]:
    """(figures, per-sequence Σ Δ, per-sequence token count) of one pair of equal shapes (a mask
    of the same number of elements). Floating point only: token ids are no log-probs. With `into`
    the pair's figures are added to those (one kernel call per pair, no per-pair histogram)."""
    a, b = np.asarray(a), np.asarray(b)
    check_shapes(a, b, mask)
    a2, b2 = as_rows(a), as_rows(b)
    m2 = np.ones(a2.shape, np.uint8) if mask is None else mask_bytes(mask).reshape(a2.shape)
    f = PairFigures() if into is None else into
    sums = np.zeros(7)
    seq_sum = np.zeros(a2.shape[0])
    seq_n = np.zeros(a2.shape[0], np.int64)
    lo = math.log(1.0 - eps) if eps < 1 else -math.inf
    rows_kernel(a2, b2, m2)(a2, b2, m2, lo, math.log(1.0 + eps), PROBABILITY_OF, LOG_THRESHOLDS, sums, f.hist, None,
                f.pos_count, f.pos_sum, f.pos_max, f.prob_count, f.prob_sum, seq_sum, seq_n)
    f.tokens += int(sums[0])
    f.sum_delta += sums[1]
    f.sum_sq += sums[2]
    f.sum_abs += sums[3]
    f.max_abs = max(f.max_abs, sums[4])
    f.outside += int(sums[5])
    f.nonfinite += int(sums[6])
    return f, seq_sum, seq_n
