-- Macros shared by key_data.sql and modules.sql (and their pairs): how a pair of tensors is
-- labelled, measured and described, defined once. They take the columns they need, never a whole
-- row: a row passed to a macro is packed into a struct per row, which costs as much as the query.
-- `a`/`b` in stat_sides: one run's statistics row of the pairs' FULL JOIN; kernel_<metric>: the
-- element kernel's result columns (NULL where the tensors were not compared).
-- A new comparison metric is one more parameter and field of compared_metrics, one more argument
-- where key_data.sql and modules.sql call it (and its column header).

-- where a key-data tensor lies, as one text (the pairs' file_a, file_b): its tensor_file, with
-- '#<offset>+<length>' for a record of a packed file (lake/tensor_pack.py: split_address)
CREATE OR REPLACE TEMP MACRO tensor_address(file, "offset", length) AS
    CASE WHEN "offset" IS NULL THEN file ELSE file || '#' || "offset" || '+' || length END;

-- both runs' statistics of one pair, as columns <name>_a, <name>_b
CREATE OR REPLACE TEMP MACRO stat_sides(a, b) AS {
    'shape_a': a.shape, 'shape_b': b.shape,
    'dtype_a': a.dtype, 'dtype_b': b.dtype,
    'numel_a': a.numel, 'numel_b': b.numel,
    'min_a': a.min, 'min_b': b.min, 'max_a': a.max, 'max_b': b.max,
    'mean_a': a.mean, 'mean_b': b.mean, 'norm_a': a.norm, 'norm_b': b.norm,
    'nan_count_a': a.nan_count, 'nan_count_b': b.nan_count,
    'inf_count_a': a.inf_count, 'inf_count_b': b.inf_count,
    'zero_count_a': a.zero_count, 'zero_count_b': b.zero_count,
    'hash_a': a.hash, 'hash_b': b.hash,
    'file_a': a.tensor_file, 'file_b': b.tensor_file
};

-- the statistics columns of a result row (after its metrics and message), in stat_sides' order:
-- SELECT COLUMNS(lambda c: side_statistic(c))
CREATE OR REPLACE TEMP MACRO side_statistic(c) AS
    regexp_full_match(c, '(min|max|mean|norm|nan_count|inf_count|zero_count|hash|file)_[ab]');

CREATE OR REPLACE TEMP MACRO dtype_differs(dtype_a, dtype_b) AS
    dtype_a IS NOT NULL AND dtype_b IS NOT NULL AND dtype_a <> dtype_b;

CREATE OR REPLACE TEMP MACRO shape_differs(shape_a, shape_b) AS coalesce(shape_a <> shape_b, false);

-- percent of the compared elements (100 for an empty pair; NULL when not compared)
CREATE OR REPLACE TEMP MACRO compared_pct(count, numel, compared) AS
    CASE WHEN compared THEN CASE WHEN numel = 0 THEN 100.0 ELSE 100.0 * count / numel END END;

-- the element metrics of a pair, as its result columns (numel: the statistics' where not compared)
CREATE OR REPLACE TEMP MACRO compared_metrics(compared, kernel_numel, numel_a, numel_b, equal_count,
                                              first_mismatch_index, max_abs_err, max_rel_err, within_1e3_count,
                                              within_1e2_count, cosine, nan_mismatch_count) AS {
    'numel': coalesce(kernel_numel, numel_a, numel_b),
    'equal_count': equal_count,
    'same_pct': compared_pct(equal_count, kernel_numel, compared),
    'first_mismatch_index': first_mismatch_index,
    'max_abs_err': max_abs_err,
    'max_rel_err': max_rel_err,
    'within_1e3_pct': compared_pct(within_1e3_count, kernel_numel, compared),
    'within_1e2_pct': compared_pct(within_1e2_count, kernel_numel, compared),
    'cosine': cosine,
    'nan_mismatch_count': nan_mismatch_count
};

-- the scale a pair's errors are measured against: the larger of both sides' largest magnitudes
-- (|x|inf = max(|min|, |max|), from their statistics; NULL where neither side has them)
CREATE OR REPLACE TEMP MACRO pair_scale(min_a, max_a, min_b, max_b) AS
    greatest(abs(min_a), abs(max_a), abs(min_b), abs(max_b));

-- the max-norm relative error max|a-b| / max(|a|inf, |b|inf) (rlprobe/comparison/tolerance.py): not
-- inflated by near-zero elements, as the element-wise max_rel_err is
CREATE OR REPLACE TEMP MACRO norm_rel_err(max_abs_err, scale) AS
    CASE WHEN max_abs_err = 0 THEN 0.0 WHEN scale > 0 THEN max_abs_err / scale END;

-- an element-wise compared pair whose difference rounding explains: NaN in the same places and
-- max|a-b| <= atol + rtol * scale
CREATE OR REPLACE TEMP MACRO within_tolerance(max_abs_err, nan_mismatch_count, scale, rtol, atol) AS
    coalesce(coalesce(nan_mismatch_count, 0) = 0 AND max_abs_err <= atol + rtol * coalesce(scale, 0), false);

-- the largest norm_rel_err a tolerance's atol + rtol * scale allows (NULL where the scale is 0 or unknown)
CREATE OR REPLACE TEMP MACRO tolerance_bound(scale, rtol, atol) AS
    CASE WHEN scale > 0 THEN rtol + atol / scale END;

-- a pair within a control run's envelope (rlprobe/comparison/control_run.py): its norm_rel_err at most the
-- envelope of its key and step (NULL: no envelope, the dtype tolerance alone judges)
CREATE OR REPLACE TEMP MACRO within_envelope(err, envelope) AS coalesce(err <= envelope, false);

-- one statistic of both runs within atol + rtol * scale
CREATE OR REPLACE TEMP MACRO stat_close(x, y, scale, rtol, atol) AS x = y OR abs(x - y) <= atol + rtol * scale;

-- statistics-only rows: min, max, mean within atol + rtol * scale, the norm within atol + rtol * the
-- larger norm, NaN and inf counts equal (a statistic missing on both sides, an empty tensor's min, agrees)
CREATE OR REPLACE TEMP MACRO stats_close(min_a, min_b, max_a, max_b, mean_a, mean_b, norm_a, norm_b,
                                         nan_count_a, nan_count_b, inf_count_a, inf_count_b, rtol, atol) AS
    coalesce(
        stat_close(min_a, min_b, pair_scale(min_a, max_a, min_b, max_b), rtol, atol)
        AND stat_close(max_a, max_b, pair_scale(min_a, max_a, min_b, max_b), rtol, atol)
        AND stat_close(mean_a, mean_b, pair_scale(min_a, max_a, min_b, max_b), rtol, atol)
        AND stat_close(norm_a, norm_b, greatest(abs(norm_a), abs(norm_b)), rtol, atol)
        AND nan_count_a IS NOT DISTINCT FROM nan_count_b AND inf_count_a IS NOT DISTINCT FROM inf_count_b,
        min_a IS NULL AND min_b IS NULL AND norm_a IS NOT DISTINCT FROM norm_b);

-- statistics-only rows' error against their tolerance's measure: the largest difference of min, max and
-- mean over the scale, or of the norms over the larger norm
CREATE OR REPLACE TEMP MACRO stats_rel_err(min_a, min_b, max_a, max_b, mean_a, mean_b, norm_a, norm_b) AS
    greatest(norm_rel_err(greatest(abs(min_a - min_b), abs(max_a - max_b), abs(mean_a - mean_b)),
                          pair_scale(min_a, max_a, min_b, max_b)),
             norm_rel_err(abs(norm_a - norm_b), greatest(abs(norm_a), abs(norm_b))));

-- a pair's status; close: element-wise within its tolerance; stats_equal, stats_close: whether its
-- statistics agree bitwise (or by hash) and within tolerance (each comparison's own rule)
CREATE OR REPLACE TEMP MACRO pair_status(in_a, in_b, absent_a, absent_b, shape_a, shape_b, dtype_a, dtype_b,
                                         compared, kernel_error, kernel_numel, equal_count, close, stats_equal,
                                         stats_close) AS
    CASE
        WHEN NOT in_b THEN 'only_in_a'
        WHEN NOT in_a THEN 'only_in_b'
        WHEN absent_a AND absent_b THEN 'absent_in_both'
        WHEN absent_a THEN 'absent_in_a'
        WHEN absent_b THEN 'absent_in_b'
        WHEN shape_differs(shape_a, shape_b) THEN 'shape_mismatch'
        WHEN kernel_error IS NOT NULL THEN 'error'
        WHEN dtype_differs(dtype_a, dtype_b) THEN 'dtype_mismatch'
        WHEN compared AND equal_count = kernel_numel THEN 'match'
        WHEN compared AND close THEN 'close'
        WHEN compared THEN 'mismatch'
        WHEN stats_equal THEN 'stats_only_match'
        WHEN stats_close THEN 'stats_only_close'
        ELSE 'stats_only_mismatch'
    END;

-- whether a float32/float64 pair's error `err` (norm_rel_err) beyond its own rtol is the size of a half-precision
-- rounding: between float16's eps / 8 and bfloat16's rtol (tolerance.py's COARSER: eps 2^-10 and 2^-7, rtol
-- 4 eps; tests/compare/test_tolerance.py holds these numbers to tolerance.py's). Which of the two is not
-- told apart: a model computed in bfloat16 whose output is float32 (the example's ref-bf16) measured 1.3e-3,
-- near float16's eps, since its errors are of its logits, not of the log-probs saved
CREATE OR REPLACE TEMP MACRO coarser_rounding(dtype, err, own_rtol) AS
    dtype IN ('float32', 'float64') AND err > own_rtol AND err >= 0.0009765625 / 8 AND err <= 4 * 0.0078125;

-- a pair's words on its tolerance: how far within it a close pair is, and for a float32/float64 pair beyond it
-- whose errors are those of a coarser dtype's rounding, that one run computes it in that dtype
CREATE OR REPLACE TEMP MACRO tolerance_text(status, dtype, err, rtol, source) AS
    CASE WHEN status IN ('close', 'stats_only_close')
             THEN format('within rounding: max|a-b|/max|a| {} <= rtol {} ({})', printf('%.3g', err),
                         printf('%.3g', rtol), source)
         WHEN status IN ('mismatch', 'stats_only_mismatch') AND coarser_rounding(dtype, err, rtol)
             THEN format('errors of half-precision rounding (max|a-b|/max|a| {}; eps: float16 9.8e-04, bfloat16 '
                         '7.8e-03): one run computes it in a coarser dtype (bfloat16 or float16) than {}',
                         printf('%.2e', err), dtype)
    END;

-- a pair's words on the control run's envelope (where it is larger than the dtype tolerance): its error
-- against it, and the control's own error it is made of
CREATE OR REPLACE TEMP MACRO envelope_text(status, err, envelope, control_err) AS
    CASE WHEN envelope IS NULL THEN NULL
         WHEN status IN ('close', 'stats_only_close')
             THEN format('within the control run''s noise: max|a-b|/max|a| {} <= envelope {} '
                         '({:g} x the control''s {})',
                         printf('%.3g', err), printf('%.3g', envelope), envelope / control_err,
                         printf('%.3g', control_err))
         WHEN status IN ('mismatch', 'stats_only_mismatch')
             THEN format('beyond the control run''s noise: max|a-b|/max|a| {} > envelope {} '
                         '({:g} x the control''s {})',
                         printf('%.3g', err), printf('%.3g', envelope), envelope / control_err,
                         printf('%.3g', control_err))
    END;

-- a pair's message: its status in words, a dtype difference, how statistics-only rows were
-- compared (`stats_text`, each comparison's own), differing NaN positions, a kernel error
CREATE OR REPLACE TEMP MACRO pair_message(status, absent_a, absent_b, shape_a, shape_b, dtype_a, dtype_b,
                                          stats_text, nan_mismatch_count, kernel_error) AS
    concat_ws('; ',
        CASE status
            WHEN 'only_in_a' THEN
                CASE WHEN absent_a THEN 'missing in run B (None in run A)' ELSE 'missing in run B' END
            WHEN 'only_in_b' THEN
                CASE WHEN absent_b THEN 'missing in run A (None in run B)' ELSE 'missing in run A' END
            WHEN 'absent_in_a' THEN 'None (not computed) in run A, a value in run B'
            WHEN 'absent_in_b' THEN 'a value in run A, None (not computed) in run B'
            WHEN 'absent_in_both' THEN 'None (not computed) in both runs'
            WHEN 'shape_mismatch' THEN format('shape {} in A, {} in B: not compared element-wise',
                                              CAST(shape_a AS VARCHAR), CAST(shape_b AS VARCHAR))
        END,
        CASE WHEN dtype_differs(dtype_a, dtype_b)
             THEN format('dtype {} in A, {} in B (compared after widening both)', dtype_a, dtype_b) END,
        stats_text,
        CASE WHEN coalesce(nan_mismatch_count, 0) > 0
             THEN format('{} NaN position(s) differ', nan_mismatch_count) END,
        kernel_error
    );
