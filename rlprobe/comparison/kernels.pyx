"""The element kernels of the comparison, compiled when rlprobe is installed (hatch_build.py): partial aggregates
of two flat arrays over a range of indices, for (float32, float32), (float64, float64) and (int64, int64), as a
tuple of float64 in the order of rlprobe.comparison.partials.FIELDS. The loops are C, in float_lanes.h (the
float sums in eight lanes, the same bits at every vector width); the element semantics are
rlprobe.comparison.pair_metrics'. file_kernels cimports `partials` (kernels.pxd) to run them on files' bytes.
"""

from libc.stdint cimport int64_t

cdef extern from "float_lanes.h" nogil:
    int CODE_F4, CODE_F8, CODE_I8
    int lanes_width
    int lanes_use(int bits)
    void lanes_partials(int code, const void *a, const void *b, int64_t start, int64_t stop, double *out)

__all__ = ["pair_f4", "pair_f8", "pair_i8", "use_vector_width", "vector_width"]

lanes_use(0)  # the widest the CPU has, once, before any thread runs a kernel


cdef void partials(int code, const void *a, const void *b, int64_t n, double *out) noexcept nogil:
    lanes_partials(code, a, b, 0, n, out)


cdef tuple _tuple(double *o):
    return (o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7], o[8], o[9], o[10])


cdef tuple _pair(int code, const void *a, const void *b, Py_ssize_t na, Py_ssize_t nb, int64_t start, int64_t stop):
    """The partials of one kernel over [start, stop) of both arrays (`a`, `b`: their first elements, NULL when empty)."""
    cdef double out[11]
    if not 0 <= start <= stop <= min(na, nb):
        raise ValueError(f"range [{start}, {stop}) is not within both arrays ({na} and {nb} elements)")
    with nogil:
        lanes_partials(code, a, b, start, stop, out)
    return _tuple(out)


def pair_f4(const float[::1] a, const float[::1] b, int64_t start, int64_t stop) -> tuple:
    """Partials of float32 arrays `a`, `b` over flat indices [start, stop)."""
    return _pair(CODE_F4, &a[0] if a.shape[0] else NULL, &b[0] if b.shape[0] else NULL, a.shape[0], b.shape[0],
                 start, stop)


def pair_f8(const double[::1] a, const double[::1] b, int64_t start, int64_t stop) -> tuple:
    """Partials of float64 arrays `a`, `b` over flat indices [start, stop)."""
    return _pair(CODE_F8, &a[0] if a.shape[0] else NULL, &b[0] if b.shape[0] else NULL, a.shape[0], b.shape[0],
                 start, stop)


def pair_i8(const int64_t[::1] a, const int64_t[::1] b, int64_t start, int64_t stop) -> tuple:
    """Partials of int64 arrays `a`, `b` over flat indices [start, stop): exact equality, errors in float64."""
    return _pair(CODE_I8, &a[0] if a.shape[0] else NULL, &b[0] if b.shape[0] else NULL, a.shape[0], b.shape[0],
                 start, stop)


def vector_width() -> int:
    """The vector width in bits the kernels run at (128: SSE2, 256: AVX2, 512: AVX-512)."""
    return lanes_width


def use_vector_width(int bits) -> int:
    """Run the kernels at `bits` (128, 256, 512; 0: the widest the CPU has) from now on, in every thread (for
    tests: the results are the same bits at each); ValueError where the CPU lacks it."""
    if lanes_use(bits) < 0:
        raise ValueError(f"this CPU cannot run the kernels at {bits} bits (it can at {lanes_width})")
    return lanes_width
