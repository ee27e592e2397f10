"""The codes of rlprobe.comparison.batch_kernels' per-file results, without numba: rlprobe.comparison.small_pairs
reads them whether the batch functions are numba's JIT kernels or their ahead-of-time compiled copies."""

from __future__ import annotations

__all__ = ["ALIGN", "BIG", "F4", "F8", "I8", "KINDS", "OK", "SLOW"]

#: per-file results of read_files (a row of 4 int64): status, dtype code, numel, data offset in the buffer
OK, SLOW, BIG = 0, 1, 2
KINDS = "biuf"  # dtype code = index of the kind here * 16 + itemsize
F4, F8, I8 = 3 * 16 + 4, 3 * 16 + 8, 1 * 16 + 8
ALIGN = 64  # files start at multiples of this in the buffer
