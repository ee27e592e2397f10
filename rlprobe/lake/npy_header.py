"""The header of a .npy file, read and written here only (the compiled readers of many small files,
comparison/file_kernels.pyx and the check's reads (checks/kernels.pyx), take what this module says of it:
numpy's plain layout, header_bytes).

plain_header reads the header numpy writes for a C-order array of a plain dtype with one regular expression:
numpy's own reader evaluates the header as Python source, which costs more than the rest of opening a small
file. Readers that open many tensor files (rlprobe compare's pairs, rlprobe check's token phase) try it first
and leave anything else to read_header (numpy's reader), which reads it or names what is wrong.
header_bytes is the header np.save writes, for the writers of tensor files and the compiled check's reads.
The last section says what those reads (checks/kernels.pyx, reduce_batch) expect of a file:
whether they run here, where numpy's header names the dtype, the dtypes accepted and the dtype whose header
they expect (token_batch.py plans a job's reads with them)."""

from __future__ import annotations

import io
import os
import re
import sys
import tokenize
from typing import BinaryIO

import numpy as np

__all__ = ["MAGIC", "PARSE_ERRORS", "header_bytes", "plain_header", "read_header"]

MAGIC = b"\x93NUMPY"  # the first bytes of every .npy file

#: what numpy's reading of a corrupt .npy header raises besides ValueError and EOFError: its parser's own
#: errors, ast's SyntaxError and tokenize's TokenError (a header such as "{'descr': ('<f4', " on any Python,
#: one holding a NUL byte on Python >= 3.12); each reader catches them with those, to name the file
PARSE_ERRORS = (SyntaxError, tokenize.TokenError)

# magic, version 1 (2-byte header length) or 2/3 (4-byte), a descr such as '<f4' or '|b1', C order,
# a shape of whole numbers, padding to 16 bytes and a newline
_PLAIN = re.compile(rb"\x93NUMPY([\x01-\x03])\x00(..(?:..)?)\{'descr': '([<>|=][a-zA-Z]\d+)', "
                    rb"'fortran_order': False, 'shape': \(((?:\d+, ?)*\d*)\), \} *\n", re.DOTALL)


def plain_header(head: bytes) -> tuple[tuple[int, ...], np.dtype, int] | None:
    """(shape, stored dtype, offset of the data) from the first bytes of a .npy file whose header is
    numpy's plain one; None for anything else (another layout, Fortran order, a structured or object
    dtype, a header longer than `head`, a length field that does not end where the header's text does)."""
    found = _PLAIN.match(head)
    if found is None or (found[1] == b"\x01") != (len(found[2]) == 2):
        return None
    if found.end() != 8 + len(found[2]) + int.from_bytes(found[2], "little"):
        return None
    try:
        dtype = np.dtype(found[3].decode())
    except TypeError:
        return None
    if dtype.hasobject or dtype.names is not None:
        return None
    return tuple(int(n) for n in found[4].split(b",") if n.strip()), dtype, found.end()


def read_header(f: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, stored dtype) of the .npy header at `f`'s position, by numpy's reader (any
    version numpy reads), `f` left at the data; ValueError, EOFError or one of PARSE_ERRORS for what is not one."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    return np.lib.format.read_array_header_2_0(f)


_headers: dict[tuple[np.dtype, tuple[int, ...]], bytes | None] = {}


def header_bytes(dtype: np.dtype, shape: tuple[int, ...]) -> bytes | None:
    """The header np.save writes before a C-order array of `dtype` and `shape` (None for an object dtype or
    one numpy's version 1.0 header cannot hold), made once per (dtype, shape)."""
    key = (dtype, tuple(shape))
    header = _headers.get(key, b"")
    if header == b"":
        if dtype.hasobject:
            header = None
        else:
            out = io.BytesIO()
            try:
                np.lib.format.write_array_header_1_0(out, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                           "fortran_order": False, "shape": key[1]})
                header = out.getvalue()
            except ValueError:
                header = None
        if len(_headers) >= 4096:
            _headers.clear()
        _headers[key] = header
    return header


# --------------------------------------------------------------------------------------
# what the check's compiled reads (checks/kernels.pyx, reduce_batch) expect of a file

COMPILED_READS = os.name == "posix" and sys.byteorder == "little"
DESCR_AT = 21  # the dtype's 3 characters in numpy's header: b"\x93NUMPY\x01\x00" b"xx" b"{'descr': '" here
FLOAT32_DESCR = np.frombuffer(b"<f4", np.uint8).reshape(1, 3)
STORED = np.dtype("<f4")  # the dtype they read: its header is header_bytes(STORED, shape)
MASK_DESCRS = np.frombuffer(b"|b1|u1|i1", np.uint8).reshape(3, 3)  # a byte a token: nonzero is counted
