/* The CPU gradient probe's and parameter fingerprints' kernels (cpu_grad_kernel.pyx; docs/grads.md).

Every float sum runs in LANES fixed lanes: element i into lane i % LANES, in order; the lanes then added
pairwise (lane k + lane k + w for w = 16, 8, 4, 2, 1). A machine with narrower vectors runs the same lanes in more
of them, so the bits are the same on every machine and at every width (tests/frameworks/test_cpu_grad_kernel.py
forces each; it also pins the order against numpy). No fused multiply-add where it would round otherwise: only a
float32's square, exact in float64, is added by one. The widths are the same C compiled for AVX-512, AVX2 + FMA and
the x86-64 baseline, picked once by __builtin_cpu_supports. Counts, signs, max/min and the digest are exact, so
their order is the compiler's. */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* LANES: 4 AVX-512 vectors a sum, enough to hide the adds' latency; CHUNK_BYTES: kept in L1 while a few loops
   read them (a multiple of LANES elements); PREFETCH_ABOVE: arrays of more bytes are read from DRAM, where asking
   for the next chunk ahead pays (measured; in cache it costs) */
enum { LANES = 32, CHUNK_BYTES = 16384, PREFETCH_ABOVE = 16 << 20 };

#define INLINE static inline __attribute__((always_inline))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

typedef double v2df __attribute__((vector_size(16)));
typedef double v4df __attribute__((vector_size(32)));
typedef double v8df __attribute__((vector_size(64)));
typedef float v2sf __attribute__((vector_size(8)));
typedef float v4sf __attribute__((vector_size(16)));
typedef float v8sf __attribute__((vector_size(32)));
typedef uint32_t v2su __attribute__((vector_size(8)));
typedef uint32_t v4su __attribute__((vector_size(16)));
typedef uint32_t v8su __attribute__((vector_size(32)));
typedef uint64_t v2du __attribute__((vector_size(16)));
typedef uint64_t v4du __attribute__((vector_size(32)));
typedef uint64_t v8du __attribute__((vector_size(64)));
typedef int64_t v2di __attribute__((vector_size(16)));
typedef int64_t v4di __attribute__((vector_size(32)));
typedef int64_t v8di __attribute__((vector_size(64)));

/* The next chunk, asked for while this one is worked on */
INLINE void prefetch(const char *next, int64_t bytes, int64_t total) {
    if (total > PREFETCH_ABOVE)
        for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(next + i);
}

INLINE double lane_sum(double *t) {
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int k = 0; k < w; k++) t[k] += t[k + w];
    return t[0];
}

/* The float64 sum and sum of squares of v[0:n] added into the lanes s, ss (element i into lane i % LANES; n a
   multiple of LANES but at the array's end): LANES / DL vectors of VD, the width's DL doubles, VT as many T;
   WIDEN(x): x as doubles; SQUARE_ADD(d, acc): acc + d * d. */
#define SUMS(NAME, T, VD, VT, WIDEN, SQUARE_ADD)                                                                  \
INLINE void NAME##_tail(const T *v, int64_t from, int64_t n, double *s, double *ss) {                        \
    for (int64_t i = from; i < n; i++) {                                                                      \
        s[i % LANES] += (double)v[i];                                                                         \
        ss[i % LANES] += (double)v[i] * (double)v[i];                                                         \
    }                                                                                                         \
}                                                                                                             \
INLINE void NAME(const T *v, int64_t n, double *s, double *ss) {                                              \
    enum { DL = sizeof(VD) / sizeof(double), ND = LANES / DL };                                               \
    VD vs[ND], vss[ND];                                                                                       \
    memcpy(vs, s, sizeof vs);                                                                                 \
    memcpy(vss, ss, sizeof vss);                                                                              \
    int64_t full = n / LANES * LANES;                                                                         \
    for (int64_t i = 0; i < full; i += LANES)                                                                 \
        for (int q = 0; q < ND; q++) {                                                                        \
            VT x;                                                                                             \
            memcpy(&x, v + i + q * DL, sizeof x);                                                             \
            VD d = WIDEN(x);                                                                                  \
            vs[q] += d;                                                                                       \
            vss[q] = SQUARE_ADD(d, vss[q]);                                                                   \
        }                                                                                                     \
    memcpy(s, vs, sizeof vs);                                                                                 \
    memcpy(ss, vss, sizeof vss);                                                                              \
    NAME##_tail(v, full, n, s, ss);                                                                           \
}

/* The grad statistics of one dtype: T the float, I and U the ints of its width, SUMS_T its sums. Each chunk is
   read by a few loops while it is in L1; the integer ones the compiler vectorises as it likes. Max and min come
   from the bits' signed max and min and unsigned max (integer max/min vectorize where float ones, with NaN and
   signed zeros, do not): non-negative floats order like their bits as signed ints, negative ones by magnitude,
   which their bits follow as signed and as unsigned ints. So the max is the signed max when a value is
   non-negative, else the signed min; the min is the unsigned max (sign-bit values dominate it) when a value is
   negative, else the signed min; -0.0 (the signed int minimum) sorts below +0.0. */
#define MINMAX_ZEROS(I, U)                                                                                    \
    I b;                                                                                                      \
    memcpy(&b, p + i, sizeof b);                                                                              \
    smax = MAX(smax, b);                                                                                      \
    smin = MIN(smin, b);                                                                                      \
    umax = MAX(umax, (U)b);                                                                                   \
    zeros += p[i] == 0
#define GRAD_STATS(NAME, T, I, U, SUMS_T)                                                                        \
INLINE void NAME##_body(const T *a, int64_t n, const T *bounds, int64_t nb, double *row, uint8_t *signs) {     \
    enum { CHUNK = CHUNK_BYTES / sizeof(T) };                                                                 \
    double s[LANES] = {0}, ss[LANES] = {0};                                                                   \
    I smax, smin;                                                                                             \
    memcpy(&smax, a, sizeof smax);                                                                            \
    smin = smax;                                                                                              \
    U umax = (U)smax;                                                                                         \
    int64_t zero = 0, cnt[4] = {0};                                                                           \
    T b4[4];                                                                                                  \
    for (int j = 0; j < 4; j++) b4[j] = j < nb ? bounds[j] : (T)NAN;                                          \
    for (int64_t j = 4; j < nb; j++) row[4 + j] = 0;                                                          \
    for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {                                                               \
        const T *p = a + c0;                                                                                  \
        int64_t m = MIN(n - c0, CHUNK);                                                                       \
        prefetch((const char *)(p + m), (int64_t)sizeof(T) * MIN(n - c0 - m, CHUNK), (int64_t)sizeof(T) * n);  \
        /* the first loop reads the chunk from memory: it also counts against the first 4 bounds (NaN for those
           missing: never counted), the rest a loop each over the chunk in L1. 32-bit counts: a chunk's fit. */ \
        int32_t zeros = 0, c0n = 0, c1n = 0, c2n = 0, c3n = 0;                                                \
        if (nb)                                                                                               \
            for (int64_t i = 0; i < m; i++) {                                                                 \
                MINMAX_ZEROS(I, U);                                                                           \
                c0n += p[i] <= b4[0];                                                                         \
                c1n += p[i] <= b4[1];                                                                         \
                c2n += p[i] <= b4[2];                                                                         \
                c3n += p[i] <= b4[3];                                                                         \
            }                                                                                                 \
        else                                                                                                  \
            for (int64_t i = 0; i < m; i++) {                                                                 \
                MINMAX_ZEROS(I, U);                                                                           \
            }                                                                                                 \
        zero += zeros;                                                                                        \
        cnt[0] += c0n;                                                                                        \
        cnt[1] += c1n;                                                                                        \
        cnt[2] += c2n;                                                                                        \
        cnt[3] += c3n;                                                                                        \
        SUMS_T(p, m, s, ss);                                                                                  \
        if (signs) {                                                                                          \
            uint8_t *out = signs + c0 / 8;                                                                    \
            for (int64_t q = 0; q < m / 8; q++) {                                                             \
                const T *x = p + 8 * q;                                                                       \
                out[q] = (uint8_t)((x[0] > 0) << 7 | (x[1] > 0) << 6 | (x[2] > 0) << 5 | (x[3] > 0) << 4      \
                                   | (x[4] > 0) << 3 | (x[5] > 0) << 2 | (x[6] > 0) << 1 | (x[7] > 0));       \
            }                                                                                                 \
            if (m % 8) {  /* the last byte: padding bits 0 */                                                 \
                uint8_t last = 0;                                                                             \
                for (int64_t i = m / 8 * 8; i < m; i++) last |= (uint8_t)((p[i] > 0) << (7 - i % 8));         \
                out[m / 8] = last;                                                                            \
            }                                                                                                 \
        }                                                                                                     \
        for (int64_t j = 4; j < nb; j++) {                                                                    \
            int32_t c = 0;                                                                                    \
            const T b = bounds[j];                                                                            \
            for (int64_t i = 0; i < m; i++) c += p[i] <= b;                                                   \
            row[4 + j] += (double)c;                                                                          \
        }                                                                                                     \
    }                                                                                                         \
    double sum = lane_sum(ss);                                                                                \
    T mx, mn;                                                                                                 \
    I bmax = smax >= 0 ? smax : smin, bmin = smin < 0 ? (I)umax : smin;                                       \
    memcpy(&mx, &bmax, sizeof mx);                                                                            \
    memcpy(&mn, &bmin, sizeof mn);                                                                            \
    row[0] = isnan(sum) ? NAN : mx;                                                                           \
    row[1] = isnan(sum) ? NAN : mn;                                                                           \
    row[2] = isnan(sum) ? NAN : (T)sqrt(sum);                                                                 \
    row[3] = (double)zero;                                                                                    \
    for (int64_t j = 0; j < MIN(nb, 4); j++) row[4 + j] = (double)cnt[j];                                     \
}

#define K1 ((uint64_t)-7046029254386353131ll)  /* lake/grad_stats.MIX_K1, MIX_K2 */
#define K2 ((uint64_t)-4658895280553007687ll)

/* mix64 of 32-bit words w at positions start.. (lake/grad_stats.mix64_numpy): a wrapping integer sum */
INLINE uint64_t mix(const uint32_t *w, int64_t n, int64_t start) {
    uint64_t h = 0, pos = (uint64_t)start * K1;
    for (int64_t i = 0; i < n; i++, pos += K1) {  /* pos: (start + i) * k1, without the multiply */
        uint64_t y = ((uint64_t)w[i] ^ pos) * K2;
        h += y ^ (uint64_t)((int64_t)y >> 31);
    }
    return h;
}

/* The digest of v[c0:c0+m]'s own words (RATIO a value) and its sums, in one loop: the integer and the float work
   overlap. VU, VI: the width's DL uint64s and int64s; VW: DL uint32s, widened by WIDEN_U. */
#define MIX_SUMS(NAME, T, VD, VT, WIDEN, SQUARE_ADD, VU, VI, VW, WIDEN_U, SUMS_T)                              \
INLINE uint64_t NAME(const T *v, int64_t c0, int64_t m, const int RATIO, double *s, double *ss) {             \
    enum { DL = sizeof(VD) / sizeof(double), ND = LANES / DL };                                               \
    const uint32_t *w = (const uint32_t *)(v + c0);                                                           \
    VD vs[ND], vss[ND];                                                                                       \
    VU pos, h = {0};                                                                                          \
    memcpy(vs, s, sizeof vs);                                                                                 \
    memcpy(vss, ss, sizeof vss);                                                                              \
    for (int k = 0; k < DL; k++) pos[k] = (uint64_t)(c0 * RATIO + k) * K1;                                    \
    int64_t full = m / LANES * LANES;                                                                         \
    for (int64_t i = 0; i < full; i += LANES) {                                                               \
        for (int q = 0; q < ND; q++) {                                                                        \
            VT x;                                                                                             \
            memcpy(&x, v + c0 + i + q * DL, sizeof x);                                                        \
            VD d = WIDEN(x);                                                                                  \
            vs[q] += d;                                                                                       \
            vss[q] = SQUARE_ADD(d, vss[q]);                                                                   \
        }                                                                                                     \
        for (int q = 0; q < ND * RATIO; q++, pos += DL * K1) {                                                \
            VW x;                                                                                             \
            memcpy(&x, w + i * RATIO + q * DL, sizeof x);                                                     \
            VU y = (WIDEN_U(x) ^ pos) * K2;                                                                   \
            h += y ^ (VU)((VI)y >> 31);                                                                       \
        }                                                                                                     \
    }                                                                                                         \
    memcpy(s, vs, sizeof vs);                                                                                 \
    memcpy(ss, vss, sizeof vss);                                                                              \
    uint64_t total = mix(w + full * RATIO, (m - full) * RATIO, (c0 + full) * RATIO);                          \
    for (int k = 0; k < DL; k++) total += h[k];                                                               \
    SUMS_T##_tail(v + c0, full, m, s, ss);                                                                    \
    return total;                                                                                             \
}

/* out: sum, norm. ratio: words per value when w is v's own memory (1, 2), read in the same loop; 0: w
   unrelated (bf16's words beside its float32 values), read in a pass of its own */
#define FINGERPRINT(NAME, T, SUMS_T, MIX_SUMS_T)                                                              \
INLINE void NAME##_body(const T *v, int64_t n, const uint32_t *w, int64_t nw, int ratio, double *out,          \
                        uint64_t *digest) {                                                                   \
    enum { CHUNK = CHUNK_BYTES / sizeof(T) };                                                                 \
    double s[LANES] = {0}, ss[LANES] = {0};                                                                   \
    uint64_t h = 0;                                                                                           \
    if (ratio == 0) {                                                                                         \
        h = mix(w, nw, 0);                                                                                    \
        SUMS_T(v, n, s, ss);                                                                                  \
    }                                                                                                         \
    for (int64_t c0 = 0; ratio && c0 < n; c0 += CHUNK) {                                                      \
        int64_t m = MIN(n - c0, CHUNK);                                                                       \
        prefetch((const char *)(v + c0 + m), (int64_t)sizeof(T) * MIN(n - c0 - m, CHUNK), (int64_t)sizeof(T) * n); \
        h += MIX_SUMS_T(v, c0, m, sizeof(T) / 4, s, ss);                                                      \
    }                                                                                                         \
    *digest = h;                                                                                              \
    out[0] = lane_sum(s);                                                                                     \
    out[1] = sqrt(lane_sum(ss));                                                                              \
}

#define STATS_PARAMS(T) (const T *a, int64_t n, const T *bounds, int64_t nb, double *row, uint8_t *signs)
#define FP_PARAMS(T) (const T *v, int64_t n, const uint32_t *w, int64_t nw, int ratio, double *out, uint64_t *digest)
struct kernels {
    const char *name;
    void (*stats_f32) STATS_PARAMS(float);
    void (*stats_f64) STATS_PARAMS(double);
    void (*fingerprint_f32) FP_PARAMS(float);
    void (*fingerprint_f64) FP_PARAMS(double);
};

/* A width: the bodies instantiated with its vectors (VD: its doubles, VF: as many floats) and compiled for its
   instruction set (the pragmas around it), the entry points' bodies inlined into them. A float32's square is
   exact in float64, so a fused multiply-add of it rounds as the add alone: FMA_W where the width has it. WIDEN_W:
   floats to doubles (GCC's __builtin_convertvector splits the wide ones into halves). */
#define ENTRY(NAME, PARAMS, ARGS) static void NAME PARAMS { NAME##_body ARGS; }
#define MUL_ADD(d, acc) ((acc) + (d) * (d))
#define SAME(x) (x)
#define CONVERT_2(x) __builtin_convertvector(x, v2df)
#define CONVERT_U2(x) __builtin_convertvector(x, v2du)
#define WIDTH(W, VD, VF, WIDEN_W, FMA_W, VU, VI, VW, WIDEN_U)                                                \
    SUMS(sums_f32_##W, float, VD, VF, WIDEN_W, FMA_W)                                                         \
    SUMS(sums_f64_##W, double, VD, VD, SAME, MUL_ADD)                                                         \
    MIX_SUMS(mix_sums_f32_##W, float, VD, VF, WIDEN_W, FMA_W, VU, VI, VW, WIDEN_U, sums_f32_##W)              \
    MIX_SUMS(mix_sums_f64_##W, double, VD, VD, SAME, MUL_ADD, VU, VI, VW, WIDEN_U, sums_f64_##W)              \
    GRAD_STATS(stats_f32_##W, float, int32_t, uint32_t, sums_f32_##W)                                         \
    GRAD_STATS(stats_f64_##W, double, int64_t, uint64_t, sums_f64_##W)                                        \
    FINGERPRINT(fingerprint_f32_##W, float, sums_f32_##W, mix_sums_f32_##W)                                   \
    FINGERPRINT(fingerprint_f64_##W, double, sums_f64_##W, mix_sums_f64_##W)                                  \
    ENTRY(stats_f32_##W, STATS_PARAMS(float), (a, n, bounds, nb, row, signs))                                 \
    ENTRY(stats_f64_##W, STATS_PARAMS(double), (a, n, bounds, nb, row, signs))                                \
    ENTRY(fingerprint_f32_##W, FP_PARAMS(float), (v, n, w, nw, ratio, out, digest))                           \
    ENTRY(fingerprint_f64_##W, FP_PARAMS(double), (v, n, w, nw, ratio, out, digest))                          \
    static const struct kernels kernels_##W = {#W, stats_f32_##W, stats_f64_##W, fingerprint_f32_##W,         \
                                               fingerprint_f64_##W};

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  /* clang: no #pragma GCC target */
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")
#define FMA_512(d, acc) ((v8df)_mm512_fmadd_pd((__m512d)(d), (__m512d)(d), (__m512d)(acc)))
#define WIDEN_512(x) ((v8df)_mm512_cvtps_pd((__m256)(x)))
#define WIDEN_U512(x) ((v8du)_mm512_cvtepu32_epi64((__m256i)(x)))
WIDTH(avx512, v8df, v8sf, WIDEN_512, FMA_512, v8du, v8di, v8su, WIDEN_U512)
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define FMA_256(d, acc) ((v4df)_mm256_fmadd_pd((__m256d)(d), (__m256d)(d), (__m256d)(acc)))
#define WIDEN_256(x) ((v4df)_mm256_cvtps_pd((__m128)(x)))
#define WIDEN_U256(x) ((v4du)_mm256_cvtepu32_epi64((__m128i)(x)))
WIDTH(avx2, v4df, v4sf, WIDEN_256, FMA_256, v4du, v4di, v4su, WIDEN_U256)
#pragma GCC pop_options
WIDTH(sse2, v2df, v2sf, CONVERT_2, MUL_ADD, v2du, v2di, v2su, CONVERT_U2)
static const struct kernels *const all_kernels[] = {&kernels_avx512, &kernels_avx2, &kernels_sse2};
static int width_supported(int i) {
    __builtin_cpu_init();
    if (i == 0) return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                       && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    return i == 2 || (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
}
#else
WIDTH(generic, v2df, v2sf, CONVERT_2, MUL_ADD, v2du, v2di, v2su, CONVERT_U2)
static const struct kernels *const all_kernels[] = {&kernels_generic};
static int width_supported(int i) { (void)i; return 1; }
#endif
enum { N_WIDTHS = sizeof all_kernels / sizeof all_kernels[0] };
