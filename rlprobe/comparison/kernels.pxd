from libc.stdint cimport int64_t

cdef void partials(int code, const void *a, const void *b, int64_t n, double *out) noexcept nogil
