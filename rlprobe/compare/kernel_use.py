"""Whether a comparison may run the compiled (numba) kernels, told from run A's tensor files before
its statistics are read: `rlprobe compare` loads numba in a thread ahead of the pairs only then.

A comparison of fewer than small_pairs.BATCH_MIN pairs, each under numpy_kernels.SEQUENTIAL_BELOW
elements, runs in numpy (pair_metrics.chunk_partial) and never needs numba: loading it anyway
costs ~0.3 s of CPU on a 2-core machine, most of a small comparison's start-up (issue 18). Run A
bounds the pairs (each pair has a file in A, of the same number of elements as B's). The answer
only decides what is loaded ahead, never a result: a wrong "no" loads numba with its first pair.
"""

from __future__ import annotations

import os

from rlprobe.compare.numpy_kernels import SEQUENTIAL_BELOW
from rlprobe.compare.small_pairs import BATCH_MIN

__all__ = ["may_run_compiled_kernels"]

_SMALL_NPY_BYTES = 256 + (SEQUENTIAL_BELOW - 1) * 8  # a header and fewer than SEQUENTIAL_BELOW 8-byte elements
_LOOK_AT = 512  # directory entries looked at before answering "yes" (a large dump)


def may_run_compiled_kernels(dump_a) -> bool:
    """False when run A holds fewer than BATCH_MIN (16) `.npy` files, each of at most 312 bytes (a comparison
    numpy does whole); True otherwise, and for a dump too large to tell from 512 directory entries."""
    if dump_a.format == "rlprobe":
        roots = [os.path.join(dump_a.path, "tensors", kind) for kind in ("key_data", "module")]
    else:
        roots = [os.fspath(dump_a.path)]
    files = 0
    budget = _LOOK_AT
    stack = [r for r in roots if os.path.isdir(r)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                budget -= 1
                if budget < 0:
                    return True
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.name.endswith(".npy"):
                        files += 1
                        if files >= BATCH_MIN or entry.stat().st_size > _SMALL_NPY_BYTES:
                            return True
                except OSError:
                    continue
    return False
