"""The header of a .npy file as numpy writes it for a C-order array of a plain dtype, read with one
regular expression: numpy's own reader evaluates the header as Python source, which costs more than
the rest of opening a small file. Readers that open many tensor files (rlprobe compare's pairs,
rlprobe check's token phase) try this first and leave anything else to numpy, which reads it or
names what is wrong."""

from __future__ import annotations

import re
import tokenize

import numpy as np

__all__ = ["PARSE_ERRORS", "plain_header"]

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
