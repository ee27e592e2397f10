/* The token kernels' loops (kernels.pyx is their Python face): reduce_rows and reduce_maxima of one pair of
 * log-prob rows, float32 or float64, in 8 lanes of float64 written with GCC's vector extensions. token_lanes.h is
 * their body, compiled here once an instruction set, each on vectors of its own width W (the 8 lanes as 8 / W
 * vectors: GCC splits a wider vector than the machine has into scalars): on x86-64 the default (SSE2, W = 2), AVX2
 * (4) and AVX-512 (8), the widest the CPU runs picked at import (token_use_isa); elsewhere the compiler's default.
 * A token's lane is its position mod 8 at every width and the lanes are added in one fixed order (LANE_SUM), so the
 * sums have the same bits on any machine; no fused multiply-add (-ffp-contract=off), no fast-math. */
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#pragma GCC diagnostic ignored "-Wpsabi"  /* vectors are never passed between functions that are not inlined */
#pragma GCC diagnostic ignored "-Wunused-local-typedefs"  /* VECTOR_WIDTH declares every type a function may use */

#define TOKEN_POSITIONS 24    /* token_figures.N_POSITIONS */
#define TOKEN_PROBABILITY 10  /* token_figures.N_PROBABILITY */
#define TOKEN_BLOCK_BITS 6    /* token_figures.BLOCK_BITS */
#define TOKEN_SKIP 0xFFFF     /* a token the scatter pass skips (masked out or non-finite Δ) */
#define TOKEN_BANKS 4         /* probability figures in 4 copies by position mod 4: the bits of numba's kernel */

#define VECTORS(w)                                                                                     \
    typedef double vd##w __attribute__((vector_size(8 * w)));                                          \
    typedef int64_t vl##w __attribute__((vector_size(8 * w)));                                         \
    typedef float vf##w __attribute__((vector_size(4 * w)));                                           \
    typedef int32_t vi##w __attribute__((vector_size(4 * w)));                                         \
    typedef uint32_t vu##w __attribute__((vector_size(4 * w)));                                        \
    typedef uint16_t vh##w __attribute__((vector_size(2 * w)));                                        \
    typedef double vd##w##_u __attribute__((vector_size(8 * w), aligned(1), may_alias));               \
    typedef float vf##w##_u __attribute__((vector_size(4 * w), aligned(1), may_alias));                \
    typedef uint16_t vh##w##_u __attribute__((vector_size(2 * w), aligned(1), may_alias));
VECTORS(2)
VECTORS(4)
VECTORS(8)

/* the byte of an 8-byte mask word that each lane tests */
static const int64_t MASK_BYTES[8] = {0xFF, 0xFF00, 0xFF0000, 0xFF000000, 0xFF00000000, 0xFF0000000000,
                                      0xFF000000000000, (int64_t)0xFF00000000000000ULL};

/* Where reduce_rows adds its figures (token_figures.PairFigures' arrays) and its scratch rows. */
typedef struct {
    double lo, hi;            /* log(1 - eps), log(1 + eps) */
    const int8_t *prob_of;    /* token_figures.PROBABILITY_OF */
    const double *thr;        /* token_figures.LOG_THRESHOLDS */
    double *sums;             /* tokens, Σ Δ, Σ Δ², Σ |Δ|, max |Δ|, outside, non-finite */
    int64_t *hist;
    uint8_t *touched;         /* NULL: no block marks */
    int64_t *pos_count;
    double *pos_sum, *pos_max;
    int64_t *prob_count;
    double *prob_sum;
    double *seq_sum;          /* a row's Σ Δ and count: written, not added */
    int64_t *seq_n;
    uint16_t *bins;           /* scratch: a row's bins and |Δ| */
    double *magnitude;
} token_figures;

/* the 8 lanes of an array of 8 / W vectors: lane l, and their sum in one order */
#define LANE(v, l) ((v)[(l) / W][(l) % W])
#define LANE_SUM(v) (((LANE(v, 0) + LANE(v, 1)) + (LANE(v, 2) + LANE(v, 3))) \
                     + ((LANE(v, 4) + LANE(v, 5)) + (LANE(v, 6) + LANE(v, 7))))
/* The larger of a and b in each lane (int64): a compare and a select, at AVX-512 one instruction */
#define LANE_MAX(a, b) ({ VL a_ = (a), b_ = (b), gt_ = a_ > b_; (a_ & gt_) | (b_ & ~gt_); })
/* float32 lanes to float64 ones; at AVX2 and AVX-512 the instruction itself (GCC 12 converts halves through memory) */
#define WIDEN(x) __builtin_convertvector(x, VD)
#define LOAD_AS(element, p) LOAD_AS_(element, p)  /* W elements at p as float64 lanes */
#define LOAD_AS_(element, p) LOAD_##element(p)
#define LOAD_float(p) WIDEN(*(const VF_U *)(p))
#define LOAD_double(p) (*(const VD_U *)(p))
/* The float32 bits of d rounded toward zero (ad: |d|): rounded to nearest, one step back toward zero where that
 * went past |d|; at AVX-512 the conversion's own rounding mode. The same bits. */
#define TOWARD_ZERO(d, ad) ({                                                                           \
    VF near_ = __builtin_convertvector(d, VF);                                                          \
    VL far_ = (VD)((VL)WIDEN(near_) & magnitude_bits) > (ad);                                          \
    (VU)near_ + (VU)__builtin_convertvector(far_, VI); })

#define VECTOR_WIDTH(w) VECTOR_WIDTH_(w)  /* the types of one function's vectors of w lanes */
#define VECTOR_WIDTH_(w) \
    enum { W = w, G = 8 / w }; \
    typedef vd##w VD; typedef vl##w VL; typedef vf##w VF; typedef vi##w VI; typedef vu##w VU; typedef vh##w VH; \
    typedef vd##w##_u VD_U; typedef vf##w##_u VF_U; typedef vh##w##_u VH_U;
#define ISA_ATTRIBUTE
#define ISA_WIDTH 2
#define ELEMENT float
#define KERNEL(name) name##_f32_default
#include "token_lanes.h"
#define ELEMENT double
#define KERNEL(name) name##_f64_default
#include "token_lanes.h"
#if defined(__x86_64__)
#undef ISA_ATTRIBUTE
#undef ISA_WIDTH
#undef WIDEN
#define WIDEN(x) ((VD)_mm256_cvtps_pd((__m128)(x)))
#define ISA_ATTRIBUTE __attribute__((target("avx2")))
#define ISA_WIDTH 4
#define ELEMENT float
#define KERNEL(name) name##_f32_avx2
#include "token_lanes.h"
#define ELEMENT double
#define KERNEL(name) name##_f64_avx2
#include "token_lanes.h"
#undef ISA_ATTRIBUTE
#undef ISA_WIDTH
#undef WIDEN
#undef TOWARD_ZERO
#undef LANE_MAX
#define LANE_MAX(a, b) ((VL)_mm512_max_epi64((__m512i)(a), (__m512i)(b)))
#define WIDEN(x) ((VD)_mm512_cvtps_pd((__m256)(x)))
#define TOWARD_ZERO(d, ad) ((VU)_mm512_cvt_roundpd_ps((__m512d)(d), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC))
#define ISA_ATTRIBUTE __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq")))
#define ISA_WIDTH 8
#define ELEMENT float
#define KERNEL(name) name##_f32_avx512
#include "token_lanes.h"
#define ELEMENT double
#define KERNEL(name) name##_f64_avx512
#include "token_lanes.h"
#endif

typedef void (*rows_kernel)(const void *, const void *, const uint8_t *, int64_t, int64_t, const token_figures *);
typedef void (*maxima_kernel)(const void *, const void *, const uint8_t *, int64_t, int64_t *);
typedef struct {
    const char *name;
    rows_kernel rows_f32, rows_f64;
    maxima_kernel maxima_f32, maxima_f64;
} token_isa;

static const token_isa TOKEN_ISAS[] = {
    {"default", rows_f32_default, rows_f64_default, maxima_f32_default, maxima_f64_default},
#if defined(__x86_64__)
    {"avx2", rows_f32_avx2, rows_f64_avx2, maxima_f32_avx2, maxima_f64_avx2},
    {"avx512", rows_f32_avx512, rows_f64_avx512, maxima_f32_avx512, maxima_f64_avx512},
#endif
};
static const token_isa *token_kernels = &TOKEN_ISAS[0];

/* Use the widest instruction set this CPU runs (level -1) or `level` (TOKEN_ISAS[level]); the level used, or -1
 * where the CPU does not run that one. */
static int token_use_isa(int level) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    int best = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512dq") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
#else
    int best = 0;  /* one build for the machine's own vector width */
#endif
    if (level > best) return -1;
    token_kernels = &TOKEN_ISAS[level < 0 ? best : level];
    return level < 0 ? best : level;
}
