"""Small .npy files read from compiled code: openat, one pread of header and data, close, and the
header compared with the one numpy writes for the shape in the tensor index, with no Python and
no GIL a file (reading 3,072 small files from Python took as long as the kernel on their tokens,
and one thread at a time). The C library's functions are named in the compiled code and found
when it is loaded (no address is kept in numba's cache). POSIX only: elsewhere READS is False and
token_batch.py has numpy read every file (npy_layout.py: the constants, numba-free)."""

from __future__ import annotations

import numpy as np

from rlprobe.checks.npy_layout import DESCR_AT, FLOAT32, MASK_BYTES, OPEN_FLAGS, READS, npy_header  # noqa: F401
from rlprobe.numba_cache import import_numba, use_user_cache_dir

use_user_cache_dir()
import_numba()

import numba  # noqa: E402  (after the cache dir is set)
from llvmlite import ir  # noqa: E402
from numba.core import cgutils, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402


def _libc(name: str, result: ir.Type, *args: ir.Type):
    return lambda builder, values: builder.call(
        cgutils.get_or_insert_function(builder.module, ir.FunctionType(result, list(args)), name), values)


_INT, _LONG, _POINTER = ir.IntType(32), ir.IntType(64), ir.IntType(8).as_pointer()
_OPENAT = _libc("openat", _INT, _INT, _POINTER, _INT)
_PREAD = _libc("pread", _LONG, _INT, _POINTER, _LONG, _LONG)
_CLOSE = _libc("close", _INT, _INT)


@intrinsic
def _openat(typingctx, directory, path, flags):  # pragma: no cover - compiled
    return types.int32(types.int32, types.voidptr, types.int32), lambda c, builder, s, args: _OPENAT(builder, args)


@intrinsic
def _pread(typingctx, fd, buffer, count, offset):  # pragma: no cover - compiled
    def codegen(context, builder, signature, args):
        return _PREAD(builder, args)
    return types.int64(types.int32, types.voidptr, types.int64, types.int64), codegen


@intrinsic
def _close(typingctx, fd):  # pragma: no cover - compiled
    return types.int32(types.int32), lambda c, builder, s, args: _CLOSE(builder, args)


@intrinsic
def _address(typingctx, array, at):  # pragma: no cover - compiled
    """The address of array[at] (a contiguous 1-D array) for a C call."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.bitcast(builder.gep(data, [args[1]]), _POINTER)
    return types.voidptr(array, types.intp), codegen


@numba.njit(cache=True, nogil=True)
def read_npy(directory, flags, paths, at, offset, header, descrs, buffer, nbytes):  # pragma: no cover - compiled
    """The file whose NUL-terminated path (relative to the open `directory`) starts at paths[at], from byte
    `offset` on (a record of a packed file, lake/tensor_pack.py; 0: a whole .npy), into
    buffer[:header.size + nbytes]; True where it holds that many bytes and starts with `header`
    save for the dtype, which is one of `descrs` ([k, 3] bytes); False (or the file cannot be opened):
    the caller has numpy read it, which reads it or says why not."""
    fd = _openat(np.int32(directory), _address(paths, at), np.int32(flags))
    if fd < 0:
        return False
    want = header.size + nbytes
    got = _pread(fd, _address(buffer, 0), want, offset)
    _close(fd)
    if got != want:
        return False
    for i in range(header.size):
        if buffer[i] != header[i] and not DESCR_AT <= i < DESCR_AT + 3:
            return False
    for d in range(descrs.shape[0]):
        if (buffer[DESCR_AT] == descrs[d, 0]) & (buffer[DESCR_AT + 1] == descrs[d, 1]) \
                & (buffer[DESCR_AT + 2] == descrs[d, 2]):
            return True
    return False
