"""What the compiled .npy reads (token_batch_kernel.read_npy) expect of a file, without numba: whether they run here, the
flags they open files with, where numpy's header names the dtype, the dtypes accepted and the dtype whose header
they expect (token_batch.py plans a job's reads with them)."""

from __future__ import annotations

import os
import sys

import numpy as np

from rlprobe.lake.regular_files import READ_FLAGS

READS = os.name == "posix" and sys.byteorder == "little"
OPEN_FLAGS = READ_FLAGS  # O_NONBLOCK among them: a FIFO is never waited on (lake/regular_files.py)
DESCR_AT = 21  # the dtype's 3 characters in numpy's header: b"\x93NUMPY\x01\x00" b"xx" b"{'descr': '" here
FLOAT32 = np.frombuffer(b"<f4", np.uint8).reshape(1, 3)
STORED = np.dtype("<f4")  # the dtype they read: its header is lake/npy_header.header_bytes(STORED, shape)
MASK_BYTES = np.frombuffer(b"|b1|u1|i1", np.uint8).reshape(3, 3)  # a byte a token: nonzero is counted
