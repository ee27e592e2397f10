/* The element loops of the comparison (rlprobe/comparison/kernels.pyx is their Python face): partial
 * aggregates of two flat arrays, in the order of rlprobe.comparison.partials.FIELDS.
 *
 * Eight lanes, always: element i of a block of BLOCK elements goes to lane i % 8, the float sums (dot,
 * squares) are added lane by lane, the lanes in order at the block's end and the blocks' sums in order.
 * GCC's vector types compile to one AVX-512 register, two AVX2 or four SSE2 ones a lane group, with the
 * same IEEE operations lane for lane (no FMA: -ffp-contract=off, no fast-math), so the sums have the same
 * bits at every width (tests/compare/test_pair_kernels.py); the width is picked once, at import, from what the
 * CPU supports (lanes_use). A range of fewer than 8 elements is added in index order.
 *
 * A float block takes a branch-free pass (block_*) where its values are finite; one holding a NaN or an
 * infinity, or values large enough for a difference (or a square) to overflow, is redone element by element
 * with every rule of rlprobe.comparison.pair_metrics (exact_*), into the same lanes. Counts and the rel err's
 * division are done only in blocks that differ somewhere (after an equal block, in a second pass). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 8
#define BLOCK 2048
#define CODE_F4 (3 * 16 + 4) /* rlprobe.comparison.partials' dtype codes */
#define CODE_F8 (3 * 16 + 8)
#define CODE_I8 (1 * 16 + 8)

#define VECTORS(W)                                                                                          \
    typedef double v##W##d __attribute__((vector_size(8 * W)));                                             \
    typedef float v##W##f __attribute__((vector_size(4 * W)));                                              \
    typedef int64_t v##W##l __attribute__((vector_size(8 * W)));                                            \
    typedef uint64_t v##W##u __attribute__((vector_size(8 * W)));
VECTORS(2)
VECTORS(4)
VECTORS(8)

typedef struct { double dot[LANES], sa[LANES], sb[LANES]; } lane_sums;
typedef struct { int64_t eq, w3, w2; double max_abs, max_rel; int finite; } block_out;
typedef void (*block_fn)(const void *, const void *, int64_t, lane_sums *, block_out *, int, int);

/* vectors of W elements, W the target's width in doubles: GCC splits a wider vector type into the
 * target's registers for arithmetic but turns its comparisons into scalar code */
#define VEC_(w, kind) v##w##kind
#define VEC(w, kind) VEC_(w, kind)
#define VD VEC(W, d)
#define VL VEC(W, l)
#define ABS(v) ((VD)((VL)(v) & ((VL){0} + INT64_MAX)))
#define SELECT(mask, p, q) ((VD)(((VL)(p) & (mask)) | ((VL)(q) & ~(mask))))
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* float32 to float64 (exact) in one instruction: GCC 12 splits __builtin_convertvector's in two halves */
#define F4_TO_F8_2(p) ((v2d)_mm_cvtps_pd(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(p)))))
#define F4_TO_F8_4(p) ((v4d)_mm256_cvtps_pd(_mm_loadu_ps(p)))
#define F4_TO_F8_8(p) ((v8d)_mm512_cvtps_pd(_mm256_loadu_ps(p)))
#define F4_TO_F8__(w, p) F4_TO_F8_##w(p)
#define F4_TO_F8_(w, p) F4_TO_F8__(w, p)
#define LOAD_F4(v, p) ((v) = F4_TO_F8_(W, p))
/* max(p, q) in one instruction: q where p is NaN (a NaN rel err, 0 / 0, is not taken), exact otherwise */
#define MAX_2(p, q) ((v2d)_mm_max_pd((__m128d)(p), (__m128d)(q)))
#define MAX_4(p, q) ((v4d)_mm256_max_pd((__m256d)(p), (__m256d)(q)))
#define MAX_8(p, q) ((v8d)_mm512_max_pd((__m512d)(p), (__m512d)(q)))
#define MAX__(w, p, q) MAX_##w(p, q)
#define MAX_(w, p, q) MAX__(w, p, q)
#define MAX(p, q) MAX_(W, p, q)
/* count += (p <= q) lane by lane: AVX-512 adds under the comparison's mask (one instruction less) */
#define COUNT_LE_2(count, p, q) ((count) -= (p) <= (q))
#define COUNT_LE_4(count, p, q) ((count) -= (p) <= (q))
#define COUNT_LE_8(count, p, q) ((count) = (v8l)_mm512_mask_add_epi64((__m512i)(count), \
    _mm512_cmp_pd_mask((__m512d)(p), (__m512d)(q), _CMP_LE_OQ), (__m512i)(count), _mm512_set1_epi64(1)))
#define COUNT_LE__(w, count, p, q) COUNT_LE_##w(count, p, q)
#define COUNT_LE_(w, count, p, q) COUNT_LE__(w, count, p, q)
#define COUNT_LE(count, p, q) COUNT_LE_(W, count, p, q)
/* int64 and uint64 to float64, correctly rounded (as the scalar conversion), in AVX2: it has no instruction
 * for it and GCC converts element by element. The high and the low bits are each made a float64 exactly
 * (through the bits of 3 * 2^67 and 2^52, or 2^84), and their sum is the one rounding. */
#define I64_TO_F8_4(v) _mm256_add_pd(_mm256_sub_pd(_mm256_castsi256_pd(_mm256_add_epi64(_mm256_blend_epi16(       \
    _mm256_srai_epi32((__m256i)(v), 16), _mm256_setzero_si256(), 0x33), _mm256_castpd_si256(_mm256_set1_pd(  \
    442721857769029238784.)))), _mm256_set1_pd(442726361368656609280.)), _mm256_castsi256_pd(_mm256_blend_epi16( \
    (__m256i)(v), _mm256_castpd_si256(_mm256_set1_pd(0x0010000000000000)), 0x88)))
#define U64_TO_F8_4(v) _mm256_add_pd(_mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(_mm256_srli_epi64(       \
    (__m256i)(v), 32), _mm256_castpd_si256(_mm256_set1_pd(19342813113834066795298816.)))),                    \
    _mm256_set1_pd(19342813118337666422669312.)), _mm256_castsi256_pd(_mm256_blend_epi16((__m256i)(v),         \
    _mm256_castpd_si256(_mm256_set1_pd(0x0010000000000000)), 0xcc)))
#define I64_TO_F8_2(v) __builtin_convertvector((v2l)(v), v2d)
#define U64_TO_F8_2(v) __builtin_convertvector((v2u)(v), v2d)
#define I64_TO_F8_8(v) __builtin_convertvector((v8l)(v), v8d)
#define U64_TO_F8_8(v) __builtin_convertvector((v8u)(v), v8d)
#define TO_F8__(kind, w, v) ((VD)kind##_TO_F8_##w(v))
#define TO_F8_(kind, w, v) TO_F8__(kind, w, v)
#define I64_TO_F8(v) TO_F8_(I64, W, v)
#define U64_TO_F8(v) TO_F8_(U64, W, v)
#else
#define I64_TO_F8(v) __builtin_convertvector(v, VD)
#define U64_TO_F8(v) __builtin_convertvector((VEC(W, u))(v), VD)
#define MAX(p, q) SELECT((p) > (q), p, q)
#define COUNT_LE(count, p, q) ((count) -= (p) <= (q))
#define LOAD_F4(v, p) do { VEC(W, f) f_; memcpy(&f_, (p), sizeof f_); (v) = __builtin_convertvector(f_, VD); } while (0)
#endif
#define LOAD_F8(v, p) memcpy(&(v), (p), sizeof(v))

/* x, y and d = |a - b| (VD) of W elements, for each kind of input (a == b where d == 0: the
 * values are finite, or the block is redone) */
#define ELEMENTS_FLOAT(LOAD, pa, pb) VD x, y; LOAD(x, pa); LOAD(y, pb); VD d = ABS(x - y);
#define ELEMENTS_INT(LOAD, pa, pb)                                                                          \
    VL p_, q_; memcpy(&p_, (pa), sizeof p_); memcpy(&q_, (pb), sizeof q_);                                  \
    VD x = I64_TO_F8(p_), y = I64_TO_F8(q_);                                                                \
    VL gt_ = p_ > q_; /* the exact |a - b| in uint64 arithmetic, rounded once */                            \
    VL du_ = ((VL)((VEC(W, u))p_ - (VEC(W, u))q_) & gt_) | ((VL)((VEC(W, u))q_ - (VEC(W, u))p_) & ~gt_);   \
    VD d = U64_TO_F8(du_);

/* one block of n elements: the largest |a - b|, whether all are finite, and (with `commit`, where they are)
 * the sums added to `s`, lane l of 8 holding elements l, l + 8, ...; with `rel`, the counts and the largest
 * rel err too (without, a block whose largest |a - b| is 0 is all equal) */
#define STEP(ELEMENTS, LOAD, pa, pb, u) /* 8 elements: K vectors of W; maxima in M chains (u: 2 where K is 1) */ \
    for (int k = 0; k < K; k++) {                                                                           \
        const int c = K == 1 ? (u) : 0;                                                                     \
        ELEMENTS(LOAD, (pa) + k * W, (pb) + k * W)                                                          \
        mx[c] = MAX(d, mx[c]);                                                                              \
        if (rel) {                                                                                          \
            VD m = MAX(ABS(y), ABS(x));                                                                     \
            COUNT_LE(eq, d, (VD){0}); COUNT_LE(w3, d, 1e-3 * m); COUNT_LE(w2, d, 1e-2 * m);                 \
            mr[c] = MAX(d / m, mr[c]); /* 0 / 0 (both 0): NaN, not taken */                                 \
        }                                                                                                   \
        dot[k] += x * y; sa[k] += x * x; sb[k] += y * y;                                                    \
    }

/* counts and maxima do not depend on the order: one vector of counts, and two chains of maxima with one
 * vector a lane group (AVX-512), else one (AVX2's 16 registers hold the accumulators without spilling) */
#define BLOCK_BODY(ELEMENTS, LOAD, T, W)                                                                    \
    const T *a = (const T *)va, *b = (const T *)vb;                                                         \
    enum { K = LANES / W, M = K == 1 ? 2 : 1 };                                                             \
    VD dot[K], sa[K], sb[K], mx[M], mr[M];                                                                  \
    VL eq = {0}, w3 = {0}, w2 = {0};                                                                        \
    memcpy(dot, s->dot, sizeof dot); memcpy(sa, s->sa, sizeof sa); memcpy(sb, s->sb, sizeof sb);            \
    for (int c = 0; c < M; c++) mx[c] = mr[c] = (VD){0};                                                    \
    int64_t whole = n - n % LANES, i = 0;                                                                   \
    for (; i + 2 * LANES <= whole; i += 2 * LANES) {                                                        \
        STEP(ELEMENTS, LOAD, a + i, b + i, 0)                                                               \
        STEP(ELEMENTS, LOAD, a + i + LANES, b + i + LANES, 1)                                               \
    }                                                                                                       \
    if (i < whole) { STEP(ELEMENTS, LOAD, a + i, b + i, 0) }                                                \
    if (whole < n) { /* the last n % 8 elements, padded with zeros: equal, within, d = 0, sums + 0.0 */      \
        T ta[LANES] = {0}, tb[LANES] = {0};                                                                 \
        memcpy(ta, a + whole, (n - whole) * sizeof(T)); memcpy(tb, b + whole, (n - whole) * sizeof(T));     \
        STEP(ELEMENTS, LOAD, ta, tb, 1)                                                                     \
    }                                                                                                       \
    int64_t pad = whole < n ? LANES - (n - whole) : 0;                                                      \
    o->eq = -pad; o->w3 = -pad; o->w2 = -pad; o->max_abs = 0.0; o->max_rel = 0.0; o->finite = 1;           \
    for (int j = 0; j < W; j++) { o->eq += eq[j]; o->w3 += w3[j]; o->w2 += w2[j]; }                         \
    for (int c = 0; c < M; c++)                                                                             \
        for (int j = 0; j < W; j++) {                                                                       \
            if (mx[c][j] > o->max_abs) o->max_abs = mx[c][j];                                               \
            if (mr[c][j] > o->max_rel) o->max_rel = mr[c][j];                                               \
        }                                                                                                   \
    /* a NaN or an infinity in x or y, or |x| or |y| large enough for x - y to overflow, leaves a square, hence \
     * the block's sum of squares, not finite (so does an overflowing square) */                            \
    for (int k = 0; k < K; k++)                                                                             \
        for (int j = 0; j < W; j++) o->finite &= sa[k][j] - sa[k][j] == 0.0 && sb[k][j] - sb[k][j] == 0.0;  \
    if (commit && o->finite) {                                                                              \
        memcpy(s->dot, dot, sizeof dot); memcpy(s->sa, sa, sizeof sa); memcpy(s->sb, sb, sizeof sb);        \
    }

/* the body expanded in each function (`rel` and `commit` as loop-invariant tests, unswitched by -O3) */
#define BLOCK_FUNCTION(NAME, ATTR, ELEMENTS, LOAD, T, W)                                                    \
    ATTR static void NAME(const void *va, const void *vb, int64_t n, lane_sums *s, block_out *o, int rel,    \
                          int commit) { BLOCK_BODY(ELEMENTS, LOAD, T, W) }

#define BLOCK_SET(SUFFIX, ATTR)                                                                             \
    BLOCK_FUNCTION(block_f4_##SUFFIX, ATTR, ELEMENTS_FLOAT, LOAD_F4, float, W)                             \
    BLOCK_FUNCTION(block_f8_##SUFFIX, ATTR, ELEMENTS_FLOAT, LOAD_F8, double, W)                            \
    BLOCK_FUNCTION(block_i8_##SUFFIX, ATTR, ELEMENTS_INT, LOAD_F8, int64_t, W)

#define W 2
BLOCK_SET(base, )  /* SSE2 on x86-64, the compiler's default elsewhere */
#undef W
#if defined(__x86_64__) && defined(__GNUC__)
#define W 4
BLOCK_SET(avx2, __attribute__((target("avx2"))))
#undef W
#define W 8
BLOCK_SET(avx512, __attribute__((target("avx512f,avx512dq,avx512vl"))))
#undef W
#endif

static block_fn lanes_f4 = block_f4_base, lanes_f8 = block_f8_base, lanes_i8 = block_i8_base;
static int lanes_width = 128;

/* Use the block loops of one vector width in bits (128, 256, 512; 0: the widest the CPU has);
 * returns the width used, or -1 where the CPU lacks it. */
static int lanes_use(int bits) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    int has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")
                 && __builtin_cpu_supports("avx512vl");
    int has256 = __builtin_cpu_supports("avx2");
    if (bits == 0) bits = has512 ? 512 : has256 ? 256 : 128;
    if (bits == 512 && has512) {
        lanes_f4 = block_f4_avx512; lanes_f8 = block_f8_avx512; lanes_i8 = block_i8_avx512;
    } else if (bits == 256 && has256) {
        lanes_f4 = block_f4_avx2; lanes_f8 = block_f8_avx2; lanes_i8 = block_i8_avx2;
    } else if (bits == 128) {
        lanes_f4 = block_f4_base; lanes_f8 = block_f8_base; lanes_i8 = block_i8_base;
    } else {
        return -1;
    }
#else
    if (bits == 0) bits = 128;
    if (bits != 128) return -1;
#endif
    lanes_width = bits;
    return bits;
}

/* A block with a NaN or an infinity, or a difference that overflows: element by element, every rule of
 * pair_metrics; sums over the elements where both values are finite, into lane (i - lane0) % 8. */
#define EXACT_BLOCK(NAME, T)                                                                                \
    static void NAME(const T *a, const T *b, int64_t start, int64_t stop, int64_t lane0, lane_sums *s,       \
                     int64_t *eq, int64_t *w3, int64_t *w2, int64_t *first, int64_t *nanmis,                 \
                     double *max_abs, double *max_rel) {                                                     \
        for (int64_t i = start; i < stop; i++) {                                                            \
            double x = a[i], y = b[i];                                                              \
            int l = (int)((i - lane0) % LANES);                                                             \
            if (x == y) {                                                                                   \
                ++*eq; ++*w3; ++*w2;                                                                        \
                if (x - x == 0.0) { s->dot[l] += x * y; s->sa[l] += x * x; s->sb[l] += y * y; }             \
                continue;                                                                                   \
            }                                                                                               \
            if (x != x || y != y) {                                                                         \
                if (x != x && y != y) { ++*eq; ++*w3; ++*w2; }                                              \
                else { ++*nanmis; if (*first < 0) *first = i; }                                             \
                continue;                                                                                   \
            }                                                                                               \
            if (*first < 0) *first = i;                                                                     \
            double ax = fabs(x), ay = fabs(y), m = ax > ay ? ax : ay, rel;                                  \
            if (m == INFINITY) { /* an infinity against a finite value or the opposite infinity */          \
                *max_abs = INFINITY; rel = ax == ay ? 2.0 : 1.0;                                            \
                if (rel > *max_rel) *max_rel = rel;                                                         \
                continue;                                                                                   \
            }                                                                                               \
            double d = fabs(x - y);                                                                         \
            rel = d == INFINITY ? fabs(x / m - y / m) : d / m; /* finite values whose difference overflows */ \
            if (d > *max_abs) *max_abs = d;                                                                 \
            if (rel > *max_rel) *max_rel = rel;                                                             \
            if (d <= 1e-3 * m) ++*w3;                                                                       \
            if (d <= 1e-2 * m) ++*w2;                                                                       \
            s->dot[l] += x * y; s->sa[l] += x * x; s->sb[l] += y * y;                                       \
        }                                                                                                   \
    }

EXACT_BLOCK(exact_f4, float)
EXACT_BLOCK(exact_f8, double)

/* The partials of a[start:stop] against b[start:stop] (dtype `code`: CODE_F4, CODE_F8 or CODE_I8) into
 * out[0..10], partials.FIELDS' order. */
static void lanes_partials(int code, const void *a, const void *b, int64_t start, int64_t stop, double *out) {
    size_t item = code == CODE_F4 ? 4 : 8;
    block_fn block = code == CODE_F4 ? lanes_f4 : code == CODE_F8 ? lanes_f8 : lanes_i8;
    lane_sums s;
    memset(&s, 0, sizeof s);
    int64_t eq = 0, w3 = 0, w2 = 0, first = -1, nanmis = 0;
    double max_abs = 0.0, max_rel = 0.0;
    double dot = 0.0, sa = 0.0, sb = 0.0;
    int differed = 0; /* whether the last block had some |a - b| > 0: then the next one likely has too */
    for (int64_t bs = start; bs < stop; bs += BLOCK) {
        if (bs > start) { /* the last block's sums: its lanes in order (two levels: the rounding error of
                           * a chunk's sums grows with its blocks, not its elements) */
            double bdot = 0.0, bsa = 0.0, bsb = 0.0;
            for (int l = 0; l < LANES; l++) { bdot += s.dot[l]; bsa += s.sa[l]; bsb += s.sb[l]; }
            dot += bdot; sa += bsa; sb += bsb;
            memset(&s, 0, sizeof s);
        }
        int64_t n = stop - bs < BLOCK ? stop - bs : BLOCK;
        const char *pa = (const char *)a + bs * item, *pb = (const char *)b + bs * item;
        block_out o;
        block(pa, pb, n, &s, &o, differed, 1);
        if (!o.finite) { /* a float block only */
            if (code == CODE_F4)
                exact_f4(a, b, bs, bs + n, start, &s, &eq, &w3, &w2, &first, &nanmis, &max_abs, &max_rel);
            else
                exact_f8(a, b, bs, bs + n, start, &s, &eq, &w3, &w2, &first, &nanmis, &max_abs, &max_rel);
            continue;
        }
        if (!differed && o.max_abs > 0.0) /* the counts and the rel err, in a second pass */
            block(pa, pb, n, &s, &o, 1, 0);
        else if (!differed)
            o.eq = o.w3 = o.w2 = n;
        differed = o.max_abs > 0.0;
        eq += o.eq; w3 += o.w3; w2 += o.w2;
        if (o.max_abs > max_abs) max_abs = o.max_abs;
        if (o.max_rel > max_rel) max_rel = o.max_rel;
        if (first < 0 && o.eq < n) {
            for (int64_t i = 0; i < n; i++) {
                int differs = code == CODE_F4 ? ((const float *)pa)[i] != ((const float *)pb)[i]
                            : code == CODE_F8 ? ((const double *)pa)[i] != ((const double *)pb)[i]
                            : ((const int64_t *)pa)[i] != ((const int64_t *)pb)[i];
                if (differs) { first = bs + i; break; }
            }
        }
    }
    double bdot = 0.0, bsa = 0.0, bsb = 0.0;
    for (int l = 0; l < LANES; l++) { bdot += s.dot[l]; bsa += s.sa[l]; bsb += s.sb[l]; }
    dot += bdot; sa += bsa; sb += bsb;
    double fields[11] = {(double)(stop - start), (double)eq, (double)first, max_abs, max_rel, (double)w3,
                         (double)w2, dot, sa, sb, (double)nanmis};
    memcpy(out, fields, sizeof fields);
}
