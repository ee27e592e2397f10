/* The body of the token kernels for one instruction set (ISA_ATTRIBUTE, its vectors of ISA_WIDTH lanes) and one
 * element type (ELEMENT): token_loops.h includes it once for each and names the functions KERNEL(name). A chunk
 * of 8 tokens is G = 8 / W vectors; accumulators are arrays of G vectors, lane l of the 8 in LANE(v, l). */

#define LOAD(p) LOAD_AS(ELEMENT, p)
#define MASK_WORD(p) ({ int64_t word_; memcpy(&word_, (p), 8); word_; })

/* One chunk of 8 tokens at a, b, m into the lanes; each token's bin and |Δ| stored at BIN, MAG. A token counts
 * where its mask is nonzero and Δ = b − a (in float64) is finite; its bin is the sign, exponent and top 6
 * mantissa bits of Δ rounded toward zero to float32 (from Δ itself, not from float32 operands). */
#define CHUNK(a, b, m, BIN, MAG) do {                                                               \
    int64_t word_ = MASK_WORD(m);                                                                  \
    for (int g = 0; g < G; g++) {                                                                  \
        VD d_ = LOAD((b) + g * W) - LOAD((a) + g * W);                                             \
        VD ad_ = (VD)((VL)d_ & magnitude_bits);                                                    \
        VL finite_ = ad_ < infinity, masked_ = (((VL){0} + word_) & mask_bytes[g]) != 0;           \
        VL counted_ = masked_ & finite_;                                                           \
        bad[g] -= masked_ & ~finite_;                                                              \
        ad_ = (VD)((VL)ad_ & counted_);                                                            \
        VD kept_ = (VD)((VL)d_ & counted_);                                                        \
        count[g] -= counted_;                                                                      \
        delta[g] += kept_;                                                                         \
        square[g] += kept_ * kept_;                                                                \
        absolute[g] += ad_;                                                                        \
        largest[g] = LANE_MAX((VL)ad_, largest[g]); /* the bits: ordered as the values >= 0 */     \
        outside[g] -= counted_ & ((d_ < lo) | (d_ > hi));                                          \
        VU bin_ = TOWARD_ZERO(d_, ad_) >> 17;                                                      \
        VU in_ = (VU)__builtin_convertvector(counted_, VI);                                        \
        *(VH_U *)((BIN) + g * W) = __builtin_convertvector((bin_ & in_) | (skip & ~in_), VH);      \
        *(VD_U *)((MAG) + g * W) = ad_;                                                            \
    }                                                                                              \
} while (0)

/* CHUNK of the n < 8 tokens at a, b, m (the other lanes: masked out). */
#define SHORT_CHUNK(a, b, m, n, BIN, MAG) do {                                                      \
    ELEMENT pa_[8] = {0}, pb_[8] = {0};                                                            \
    uint8_t pm_[8] = {0};                                                                          \
    uint16_t bins_[8];                                                                             \
    double mags_[8];                                                                               \
    memcpy(pa_, a, (n) * sizeof(ELEMENT));                                                         \
    memcpy(pb_, b, (n) * sizeof(ELEMENT));                                                         \
    memcpy(pm_, m, (n));                                                                           \
    CHUNK(pa_, pb_, pm_, bins_, mags_);                                                            \
    memcpy(BIN, bins_, (n) * sizeof(uint16_t));                                                    \
    memcpy(MAG, mags_, (n) * sizeof(double));                                                      \
} while (0)

/* Pass 2 of token t of the row, bank `j` (its position mod 4): its histogram bin, block and probability bucket. */
#define SCATTER(t, j) do {                                                                          \
    unsigned i_ = bins[t];                                                                         \
    if (i_ != TOKEN_SKIP) {                                                                        \
        n++;                                                                                       \
        hist[i_] += 1;                                                                             \
        if (touched)                                                                               \
            touched[i_ >> TOKEN_BLOCK_BITS] = 1;                                                   \
        float x32_ = (float)ar[t];                                                                 \
        uint32_t bits_;                                                                            \
        memcpy(&bits_, &x32_, 4);                                                                  \
        int q_ = prob_of[bits_ >> 17];                                                             \
        if (q_ < 0) {                                                                              \
            double x_ = ar[t];                                                                     \
            q_ = (x_ >= thr[0]) + (x_ >= thr[1]) + (x_ >= thr[2]) + (x_ >= thr[3]) + (x_ >= thr[4])  \
                 + (x_ >= thr[5]) + (x_ >= thr[6]) + (x_ >= thr[7]) + (x_ >= thr[8]);              \
        }                                                                                          \
        bank_sum[(j) * 16 + q_] += mag[t];                                                         \
        bank_n[(j) * 16 + q_] += 1.0;                                                              \
    }                                                                                              \
} while (0)

/* token_figures' figures of `rows` rows of `width` tokens, row by row in two passes (a row's tokens stay in the
 * first-level cache between them): 1. the lanes (the row's Σ Δ; each position bucket's count, Σ and max of |Δ|,
 * the call's Σ Δ², outside and non-finite counts, all added up at the end), each token's bin and |Δ| left in the
 * scratch rows; 2. the scatter: each counted token's histogram bin, its bin's block in `touched`, and its
 * probability bucket. Positions 0..7 (buckets 0..3) are one chunk, whose lanes the end splits into buckets. */
ISA_ATTRIBUTE static void KERNEL(rows)(const void *a_, const void *b_, const uint8_t *mask, int64_t rows,
                                       int64_t width, const token_figures *f) {
    VECTOR_WIDTH(ISA_WIDTH)
    const ELEMENT *a = a_, *b = b_;
    const VD infinity = (VD){0} + __builtin_inf(), lo = (VD){0} + f->lo, hi = (VD){0} + f->hi;
    const VL magnitude_bits = (VL){0} + INT64_MAX;
    const VU skip = (VU){0} + TOKEN_SKIP;
    VL mask_bytes[G];
    memcpy(mask_bytes, MASK_BYTES, sizeof(mask_bytes));
    uint16_t *restrict bins = f->bins;
    double *restrict mag = f->magnitude;
    int64_t *restrict hist = f->hist;
    uint8_t *restrict touched = f->touched;
    const int8_t *restrict prob_of = f->prob_of;
    const double thr[9] = {f->thr[0], f->thr[1], f->thr[2], f->thr[3], f->thr[4], f->thr[5], f->thr[6], f->thr[7],
                           f->thr[8]};
    double bank_sum[TOKEN_BANKS * 16] = {0}, bank_n[TOKEN_BANKS * 16] = {0};  /* by position mod 4, bucket */
    VL counts[TOKEN_POSITIONS][G], maxima[TOKEN_POSITIONS][G];  /* a bucket's lanes (bucket 3: positions 0..7) */
    VD sums[TOKEN_POSITIONS][G];
    memset(counts, 0, sizeof(counts));
    memset(maxima, 0, sizeof(maxima));
    memset(sums, 0, sizeof(sums));
    VD square[G], delta[G];
    VL bad[G], outside[G];
    memset(square, 0, sizeof(square));
    memset(bad, 0, sizeof(bad));
    memset(outside, 0, sizeof(outside));
    double total = 0.0;
    int64_t tokens = 0;
    for (int64_t r = 0; r < rows; r++) {
        const ELEMENT *ar = a + r * width, *br = b + r * width;
        const uint8_t *mr = mask + r * width;
        memset(delta, 0, sizeof(delta));
        for (int64_t p = 3, start = 0; start < width; p++) {  /* bucket p: [2^(p-1), 2^p), in whole chunks of 8 */
            int64_t stop = p == TOKEN_POSITIONS - 1 || (INT64_C(1) << p) > width ? width : INT64_C(1) << p, t = start;
            VL count[G], largest[G];
            VD absolute[G];
            memcpy(count, counts[p], sizeof(count));
            memcpy(largest, maxima[p], sizeof(largest));
            memcpy(absolute, sums[p], sizeof(absolute));
            for (; t + 8 <= stop; t += 8)
                CHUNK(ar + t, br + t, mr + t, bins + t, mag + t);
            if (t < stop)
                SHORT_CHUNK(ar + t, br + t, mr + t, stop - t, bins + t, mag + t);
            memcpy(counts[p], count, sizeof(count));
            memcpy(maxima[p], largest, sizeof(largest));
            memcpy(sums[p], absolute, sizeof(absolute));
            start = stop;
        }
        int64_t n = 0, t = 0;
        for (; t + 4 <= width; t += 4) {  /* a bank a token of the 4: its offset a constant */
            SCATTER(t, 0);
            SCATTER(t + 1, 1);
            SCATTER(t + 2, 2);
            SCATTER(t + 3, 3);
        }
        for (; t < width; t++)
            SCATTER(t, t & 3);
        double s = LANE_SUM(delta);
        f->seq_sum[r] = s;
        f->seq_n[r] = n;
        total += s;
        tokens += n;
    }
    for (int k = 0; k < TOKEN_BANKS; k++)
        for (int q = 0; q < TOKEN_PROBABILITY; q++) {
            f->prob_sum[q] += bank_sum[k * 16 + q];
            f->prob_count[q] += (int64_t)bank_n[k * 16 + q];  /* exact: a count below 2^53 */
        }
    double total_abs = 0.0, total_max = 0.0;
    for (int p = 0; p < TOKEN_POSITIONS; p++) {
        int from = 0, to = 8, at = p < 3 ? 3 : p;  /* the first chunk's lanes: 0 (bucket 0), 1, 2..3, 4..7 (3) */
        if (p < 4)
            from = p == 0 ? 0 : 1 << (p - 1), to = 1 << p;
        int64_t count = 0, largest = 0;
        double sum = p < 4 ? 0.0 : LANE_SUM(sums[at]);
        for (int l = from; l < to; l++) {
            count += LANE(counts[at], l);
            largest = LANE(maxima[at], l) > largest ? LANE(maxima[at], l) : largest;
            if (p < 4)
                sum += LANE(sums[at], l);
        }
        double top;
        memcpy(&top, &largest, 8);
        f->pos_count[p] += count;
        f->pos_sum[p] += sum;
        f->pos_max[p] = top > f->pos_max[p] ? top : f->pos_max[p];
        total_abs += sum;
        total_max = top > total_max ? top : total_max;
    }
    int64_t out = 0, nonfinite = 0;
    for (int l = 0; l < 8; l++)
        out += LANE(outside, l), nonfinite += LANE(bad, l);
    f->sums[0] += (double)tokens;
    f->sums[1] += total;
    f->sums[2] += LANE_SUM(square);
    f->sums[3] += total_abs;
    f->sums[4] = total_max > f->sums[4] ? total_max : f->sums[4];
    f->sums[5] += (double)out;
    f->sums[6] += (double)nonfinite;
}

/* Of reduce_rows' figures only the counted tokens (out[0] +=), max |Δ| (out[1], the bits of a float64) and the
 * masked tokens whose Δ is not finite (out[2] +=), by the same rules, over n tokens: two chunks of 8 a step, each
 * into lanes of its own (exact in any order). */
#define MAXIMA(a, b, m, j) do {                                                                     \
    int64_t word_ = MASK_WORD(m);                                                                  \
    for (int g = 0; g < G; g++) {                                                                  \
        VL ad_ = (VL)(LOAD((b) + g * W) - LOAD((a) + g * W)) & magnitude_bits;                     \
        VL masked_ = (((VL){0} + word_) & mask_bytes[g]) != 0;                                     \
        VL finite_ = (VD)ad_ < infinity, counted_ = masked_ & finite_;                             \
        count[j][g] -= counted_;                                                                   \
        bad[j][g] -= masked_ & ~finite_;                                                           \
        largest[j][g] = LANE_MAX(ad_ & counted_, largest[j][g]);                                   \
    }                                                                                              \
} while (0)

ISA_ATTRIBUTE static void KERNEL(maxima)(const void *a_, const void *b_, const uint8_t *m, int64_t n, int64_t *out) {
    VECTOR_WIDTH(ISA_WIDTH)
    const ELEMENT *a = a_, *b = b_;
    const VD infinity = (VD){0} + __builtin_inf();
    const VL magnitude_bits = (VL){0} + INT64_MAX;
    VL mask_bytes[G], count[2][G], bad[2][G], largest[2][G];
    memcpy(mask_bytes, MASK_BYTES, sizeof(mask_bytes));
    memset(count, 0, sizeof(count));
    memset(bad, 0, sizeof(bad));
    memset(largest, 0, sizeof(largest));
    int64_t t = 0;
    for (; t + 16 <= n; t += 16) {
        MAXIMA(a + t, b + t, m + t, 0);
        MAXIMA(a + t + 8, b + t + 8, m + t + 8, 1);
    }
    for (; t < n; t += 8) {
        ELEMENT pa[8] = {0}, pb[8] = {0};
        uint8_t pm[8] = {0};
        int64_t left = n - t < 8 ? n - t : 8;
        memcpy(pa, a + t, left * sizeof(ELEMENT));
        memcpy(pb, b + t, left * sizeof(ELEMENT));
        memcpy(pm, m + t, left);
        MAXIMA(pa, pb, pm, 0);
    }
    int64_t top = out[1];
    for (int l = 0; l < 8; l++) {
        out[0] += LANE(count[0], l) + LANE(count[1], l);
        out[2] += LANE(bad[0], l) + LANE(bad[1], l);
        top = LANE(largest[0], l) > top ? LANE(largest[0], l) : top;
        top = LANE(largest[1], l) > top ? LANE(largest[1], l) : top;
    }
    out[1] = top;
}

#undef LOAD
#undef MASK_WORD
#undef CHUNK
#undef SHORT_CHUNK
#undef SCATTER
#undef MAXIMA
#undef ELEMENT
#undef KERNEL
