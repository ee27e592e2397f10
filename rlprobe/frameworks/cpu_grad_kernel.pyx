"""The CPU kernels of the gradient probe and of the parameter fingerprints (C in cpu_grad_kernel.h, compiled at
install: hatch_build.py; contract: docs/grads.md, docs/dump-format.md "param").

`stats_into` reads a gradient from memory once, in chunks that stay in the L1 cache, for its max and min, the
float64 sum of squares, the zero count, one count (x <= bound) per bound and the packed sign bits.
`fingerprint` reads a parameter once for the `mix64` digest of its 32-bit words (lake/grad_stats.mix64_numpy,
bit for bit) and the float64 sum and sum of squares of its values. Both release the GIL. The float sums run in
fixed lanes: their bits are the same on every machine (cpu_grad_kernel.h).
"""

from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t

import numpy as np

cdef extern from "cpu_grad_kernel.h" nogil:
    enum: N_WIDTHS, C_LANES "LANES", C_CHUNK_BYTES "CHUNK_BYTES"
    struct kernels:
        const char *name
        void (*stats_f32)(const float *a, int64_t n, const float *bounds, int64_t nb, double *row,
                          uint8_t *signs) noexcept nogil
        void (*stats_f64)(const double *a, int64_t n, const double *bounds, int64_t nb, double *row,
                          uint8_t *signs) noexcept nogil
        void (*fingerprint_f32)(const float *v, int64_t n, const uint32_t *w, int64_t nw, int ratio, double *out,
                                uint64_t *digest) noexcept nogil
        void (*fingerprint_f64)(const double *v, int64_t n, const uint32_t *w, int64_t nw, int ratio, double *out,
                                uint64_t *digest) noexcept nogil
    const kernels *all_kernels[]
    int width_supported(int i)

#: the float sums' fixed lanes, and the bytes a chunk (cpu_grad_kernel.h)
LANES, CHUNK_BYTES = C_LANES, C_CHUNK_BYTES
_F32, _F64, _U32, _U8 = (np.dtype(t) for t in (np.float32, np.float64, np.uint32, np.uint8))

_NAMES = tuple(all_kernels[i].name.decode() for i in range(N_WIDTHS))
#: the vector widths (instruction sets) this machine runs the kernels at, widest first: the first is used
WIDTHS = tuple(name for i, name in enumerate(_NAMES) if width_supported(i))
cdef const kernels *_use = all_kernels[_NAMES.index(WIDTHS[0])]


def use_width(name: str) -> str:
    """Run the kernels at `name` (one of WIDTHS) from now on; returns the width used before (for tests)."""
    global _use
    if name not in WIDTHS:
        raise ValueError(f"use_width: {name!r} is not one of this machine's widths {WIDTHS}")
    before = _use.name.decode()
    _use = all_kernels[_NAMES.index(name)]
    return before


cdef str _describe(a):
    if not isinstance(a, np.ndarray):
        return type(a).__name__
    order = "C-contiguous" if a.flags.c_contiguous else "not C-contiguous"
    return f"a {a.ndim}-D {order}{'' if a.flags.writeable else ' read-only'} {a.dtype} array"


cdef bint _is_floats(a, str what) except -1:
    """Whether `a` is float32 (else float64); a TypeError naming what was expected when it is neither, or not
    a 1-D C-contiguous numpy array."""
    dtype = getattr(a, "dtype", None)
    if (dtype is not _F32 and dtype is not _F64) or a.ndim != 1 or not a.flags.c_contiguous:
        raise TypeError(f"{what}: expected a 1-D C-contiguous float32 or float64 numpy array, got {_describe(a)}")
    return dtype is _F32


cdef _expect(a, dtype, str what, bint writable):
    if getattr(a, "dtype", None) is not dtype or a.ndim != 1 or not a.flags.c_contiguous or (
            writable and not a.flags.writeable):
        raise TypeError(f"{what}: expected a {'writable ' if writable else ''}1-D C-contiguous {dtype} array, got "
                        f"{_describe(a)}")


def stats_into(flat, bounds, row, signs, Py_ssize_t off) -> None:
    """Fill one stats row (max, min, norm, zero count, then x <= bound per bound) of a non-empty 1-D
    C-contiguous float32/float64 array and, given `signs` (uint8), its packed sign bits at byte `off`
    (np.packbits order, 1 = x > 0, padding bits 0). max/min/norm are NaN when a NaN is present (as
    torch.aminmax and vector_norm); the norm is sqrt of the float64 sum of squares, rounded to the array's
    dtype; the bounds are compared in the array's dtype; -0.0 sorts below +0.0."""
    cdef const float[::1] a32, b32
    cdef const double[::1] a64, b64
    cdef double[::1] r
    cdef uint8_t[::1] s
    cdef uint8_t *sp = NULL
    cdef bint single = _is_floats(flat, "stats_into")
    cdef Py_ssize_t n = flat.shape[0], nb
    if n == 0:
        raise ValueError("stats_into: the array is empty; a gradient's stats need at least one element")
    b = np.zeros(0, flat.dtype) if bounds is None else np.ascontiguousarray(bounds, flat.dtype)
    nb = b.shape[0]
    _expect(row, _F64, "stats_into: row", True)
    r = row
    if r.shape[0] < 4 + nb:
        raise ValueError(f"stats_into: row has {r.shape[0]} entries; {nb} bounds need {4 + nb}")
    if signs is not None:
        _expect(signs, _U8, "stats_into: signs", True)
        s = signs
        if off < 0 or off + (n + 7) // 8 > s.shape[0]:
            raise ValueError(f"stats_into: {n} sign bits at byte {off} do not fit in {s.shape[0]} bytes")
        sp = &s[0] + off
    if single:
        a32, b32 = flat, b
        with nogil:
            _use.stats_f32(&a32[0], n, &b32[0] if nb else NULL, nb, &r[0], sp)
    else:
        a64, b64 = flat, b
        with nogil:
            _use.stats_f64(&a64[0], n, &b64[0] if nb else NULL, nb, &r[0], sp)


def fingerprint(values, words=None) -> tuple[int, float, float]:
    """(mix64 digest as uint64 int, sum, norm) of a 1-D C-contiguous float32/float64 array; `words`: the
    uint32 words to digest when they are not `values`' own bytes (bf16, odd-sized 16-bit)."""
    cdef const float[::1] v32
    cdef const double[::1] v64
    cdef const uint32_t[::1] w
    cdef bint single = _is_floats(values, "fingerprint")
    cdef Py_ssize_t n = values.shape[0], nw
    cdef int ratio = 0
    cdef double out[2]
    cdef uint64_t digest
    if words is None:
        ratio = values.dtype.itemsize // 4
        words = values.view(_U32)
    _expect(words, _U32, "fingerprint: words", False)
    w = words
    nw = w.shape[0]
    if single:
        v32 = values
    else:
        v64 = values
    with nogil:
        if single:
            _use.fingerprint_f32(&v32[0] if n else NULL, n, &w[0] if nw else NULL, nw, ratio, out, &digest)
        else:
            _use.fingerprint_f64(&v64[0] if n else NULL, n, &w[0] if nw else NULL, nw, ratio, out, &digest)
    return int(digest), out[0], out[1]
