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

-- a pair's status; stats_equal: whether its statistics agree (each comparison's own rule)
CREATE OR REPLACE TEMP MACRO pair_status(in_a, in_b, absent_a, absent_b, shape_a, shape_b, dtype_a, dtype_b,
                                         compared, kernel_error, kernel_numel, equal_count, stats_equal) AS
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
        WHEN compared THEN 'mismatch'
        WHEN stats_equal THEN 'stats_only_match'
        ELSE 'stats_only_mismatch'
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
