"""The C library's file calls for compiled (numba) code, declared once: the comparison's batch and mapped
readers (comparison/batch_kernels.py, mapped_kernels.py) and the token check's reads (checks/
token_batch_kernel.py) take them from here. Each is named in the compiled code and found by the linker
when a kernel is loaded, so numba's cache and the ahead-of-time modules keep no address. POSIX only; a
kernel passes `array[i:].ctypes.data` where C takes a pointer. Imported only by kernel modules (it loads
numba)."""

from __future__ import annotations

from rlprobe.numba_cache import import_numba, use_user_cache_dir

use_user_cache_dir()
import_numba()

from llvmlite import ir  # noqa: E402  (after the cache dir is set)
from numba import types as _nt  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

__all__ = ["CLOSE", "LSEEK", "MADVISE", "MMAP", "MUNMAP", "OPEN", "OPENAT", "PREAD", "pointer"]

_BYTES = _nt.CPointer(_nt.uint8)
OPEN = _nt.ExternalFunction("open", _nt.int32(_nt.voidptr, _nt.int32))
OPENAT = _nt.ExternalFunction("openat", _nt.int32(_nt.int32, _nt.voidptr, _nt.int32))
PREAD = _nt.ExternalFunction("pread", _nt.int64(_nt.int32, _nt.voidptr, _nt.uint64, _nt.int64))
CLOSE = _nt.ExternalFunction("close", _nt.int32(_nt.int32))
LSEEK = _nt.ExternalFunction("lseek", _nt.int64(_nt.int32, _nt.int64, _nt.int32))
MMAP = _nt.ExternalFunction("mmap", _nt.int64(_nt.voidptr, _nt.uint64, _nt.int32, _nt.int32, _nt.int32, _nt.int64))
MUNMAP = _nt.ExternalFunction("munmap", _nt.int32(_BYTES, _nt.uint64))
MADVISE = _nt.ExternalFunction("madvise", _nt.int32(_BYTES, _nt.uint64, _nt.int32))


@intrinsic
def pointer(typingctx, address):  # pragma: no cover - compiled
    """An address (int64, as MMAP returned it) as a uint8 pointer, for numba.carray, MUNMAP and MADVISE."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())
    return _BYTES(_nt.int64), codegen
