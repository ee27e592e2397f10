"""The compiled kernels of the comparison, from wherever they are compiled: the ahead-of-time copies where
rlprobe.numba_cache finds them built (imported in ~6 ms of CPU, no numba: compiled for the JIT's CPU target
with the same flags, so the same bits), else numba's JIT kernels (pair_kernels, batch_kernels) as before.
numba is imported only on that second path, and only when a kernel is asked for."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

__all__ = ["batch_functions", "mapped_function", "pair_kernel"]


_PAIR_EXPORTS = {np.dtype(np.float32): "pair_f4", np.dtype(np.float64): "pair_f8", np.dtype(np.int64): "pair_i8"}


def pair_kernel(dtype: np.dtype) -> Callable[..., tuple]:
    """pair_kernels' element kernel for float32, float64 or int64 chunks (C-contiguous, 1-D, of that dtype:
    the ahead-of-time copy does not check), `(a, b, start, stop) -> its partial aggregates`."""
    from rlprobe.numba_cache import compiled_module

    module = compiled_module("compare")
    if module is not None:
        return getattr(module, _PAIR_EXPORTS[dtype])
    from rlprobe.comparison.pair_kernels import kernel_for

    return kernel_for(dtype)


def batch_functions() -> Any:
    """batch_kernels' read_files and compare_batch with the codes of their results (partials.CODES):
    the ahead-of-time copies where built, else the batch_kernels module (numba's JIT kernels)."""
    from rlprobe.numba_cache import compiled_module

    module = compiled_module("compare")
    if module is None:
        from rlprobe.comparison import batch_kernels

        return batch_kernels
    return SimpleNamespace(read_files=module.read_files, compare_batch=module.compare_batch, **_codes())


def mapped_function() -> Any:
    """mapped_kernels' compare_mapped with the codes of its results (partials.CODES): the ahead-of-time copy where
    built, else the mapped_kernels module (numba's JIT kernel)."""
    from rlprobe.numba_cache import compiled_module

    module = compiled_module("compare")
    if module is None:
        from rlprobe.comparison import mapped_kernels

        return SimpleNamespace(compare_mapped=mapped_kernels.compare_mapped, **_codes())
    return SimpleNamespace(compare_mapped=module.compare_mapped, **_codes())


def _codes() -> dict[str, Any]:
    from rlprobe.comparison import partials

    return {name: getattr(partials, name) for name in partials.CODES}
