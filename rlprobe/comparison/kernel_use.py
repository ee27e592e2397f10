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
from typing import TYPE_CHECKING

from rlprobe.comparison.numpy_kernels import SEQUENTIAL_BELOW
from rlprobe.comparison.small_pairs import BATCH_MIN
from rlprobe.lake.layout import PACK_SUFFIX

if TYPE_CHECKING:
    from rlprobe.lake.reader import Dump

__all__ = ["may_run_compiled_kernels"]

_SMALL_NPY_BYTES = 4096  # a larger file holds more than a small header and 7 elements
_LOOK_AT = 512  # directory entries looked at before answering "yes" (a large dump)


def may_run_compiled_kernels(dump_a: "Dump") -> bool:
    """False when run A holds fewer than BATCH_MIN (16) `.npy` files, each of fewer than SEQUENTIAL_BELOW
    (8) elements (a comparison numpy does whole); True otherwise, also for a file whose header cannot be
    read and for a dump too large to tell from 512 directory entries."""
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
                if entry.name.startswith("."):  # a killed writer's hidden temporary file or folder
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.name.endswith(".npy"):
                        files += 1
                        if files >= BATCH_MIN or not _few_elements(entry):
                            return True
                    elif entry.name.endswith(PACK_SUFFIX):  # a save call's records (lake/tensor_pack.py)
                        sizes = _record_sizes(entry)
                        files += len(sizes)
                        if files >= BATCH_MIN or not sizes or max(sizes) >= SEQUENTIAL_BELOW:
                            return True
                except OSError:
                    continue
    return False


def _record_sizes(entry: os.DirEntry) -> list[int]:
    """The element counts of a small packed file's records ([] for a large or unreadable one)."""
    from rlprobe.lake.tensor_pack import pack_records

    if entry.stat().st_size > BATCH_MIN * _SMALL_NPY_BYTES:
        return []
    try:
        return [_count(layout.shape) for _, layout in pack_records(entry.path)]
    except (OSError, ValueError):
        return []


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _few_elements(entry: os.DirEntry) -> bool:
    """Whether the .npy file holds fewer than SEQUENTIAL_BELOW elements (its header read)."""
    from rlprobe.lake.npy_header import PARSE_ERRORS, read_header
    from rlprobe.lake.regular_files import NPY, open_binary

    if entry.stat().st_size > _SMALL_NPY_BYTES:
        return False
    try:
        with open_binary(entry.path, NPY) as f:  # a FIFO is not waited on: the comparison names it
            shape = read_header(f)[0]
    except (OSError, ValueError, EOFError, *PARSE_ERRORS):
        return False
    n = 1
    for d in shape:
        n *= d
    return n < SEQUENTIAL_BELOW
