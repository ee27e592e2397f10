-- Macros shared by key_data.sql and modules.sql (and their pairs): how a pair of tensors is
-- labelled, measured and described, defined once. Each takes a row as a struct: `a`/`b` one
-- run's statistics row, `s` a pair row with both sides' columns (stat_sides) and `kernel`,
-- the element kernel's result row (NULL fields where the tensors were not compared).
-- A new comparison metric is one more field of compared_metrics (and its column header).

-- both runs' statistics of one pair, as columns <name>_a, <name>_b
CREATE OR REPLACE TEMP MACRO stat_sides(a, b) AS {
    'shape_a': a.shape, 'shape_b': b.shape,
    'dtype_a': a.dtype, 'dtype_b': b.dtype,
    'numel_a': a.numel, 'numel_b': b.numel,
    'file_a': a.tensor_file, 'file_b': b.tensor_file,
    'min_a': a.min, 'min_b': b.min, 'max_a': a.max, 'max_b': b.max,
    'mean_a': a.mean, 'mean_b': b.mean, 'norm_a': a.norm, 'norm_b': b.norm,
    'nan_count_a': a.nan_count, 'nan_count_b': b.nan_count,
    'inf_count_a': a.inf_count, 'inf_count_b': b.inf_count,
    'zero_count_a': a.zero_count, 'zero_count_b': b.zero_count,
    'hash_a': a.hash, 'hash_b': b.hash
};

-- the statistics columns of a result row (after its metrics and message)
CREATE OR REPLACE TEMP MACRO side_statistics(s) AS {
    'min_a': s.min_a, 'min_b': s.min_b, 'max_a': s.max_a, 'max_b': s.max_b,
    'mean_a': s.mean_a, 'mean_b': s.mean_b, 'norm_a': s.norm_a, 'norm_b': s.norm_b,
    'nan_count_a': s.nan_count_a, 'nan_count_b': s.nan_count_b,
    'inf_count_a': s.inf_count_a, 'inf_count_b': s.inf_count_b,
    'zero_count_a': s.zero_count_a, 'zero_count_b': s.zero_count_b,
    'hash_a': s.hash_a, 'hash_b': s.hash_b, 'file_a': s.file_a, 'file_b': s.file_b
};

CREATE OR REPLACE TEMP MACRO dtype_differs(s) AS
    s.dtype_a IS NOT NULL AND s.dtype_b IS NOT NULL AND s.dtype_a <> s.dtype_b;

CREATE OR REPLACE TEMP MACRO shape_differs(s) AS coalesce(s.shape_a <> s.shape_b, false);

-- percent of the compared elements (100 for an empty pair; NULL when not compared)
CREATE OR REPLACE TEMP MACRO compared_pct(count, numel, compared) AS
    CASE WHEN compared THEN CASE WHEN numel = 0 THEN 100.0 ELSE 100.0 * count / numel END END;

-- the element metrics of a pair, as its result columns (numel: the statistics' where not compared)
CREATE OR REPLACE TEMP MACRO compared_metrics(s) AS {
    'numel': coalesce(s.kernel.numel, s.numel_a, s.numel_b),
    'equal_count': s.kernel.equal_count,
    'same_pct': compared_pct(s.kernel.equal_count, s.kernel.numel, s.compared),
    'first_mismatch_index': s.kernel.first_mismatch_index,
    'max_abs_err': s.kernel.max_abs_err,
    'max_rel_err': s.kernel.max_rel_err,
    'within_1e3_pct': compared_pct(s.kernel.within_1e3_count, s.kernel.numel, s.compared),
    'within_1e2_pct': compared_pct(s.kernel.within_1e2_count, s.kernel.numel, s.compared),
    'cosine': s.kernel.cosine,
    'nan_mismatch_count': s.kernel.nan_mismatch_count
};

-- a pair's status; `s` also holds stats_equal (whether its statistics agree)
CREATE OR REPLACE TEMP MACRO pair_status(s) AS
    CASE
        WHEN NOT s.in_b THEN 'only_in_a'
        WHEN NOT s.in_a THEN 'only_in_b'
        WHEN s.absent_a AND s.absent_b THEN 'absent_in_both'
        WHEN s.absent_a THEN 'absent_in_a'
        WHEN s.absent_b THEN 'absent_in_b'
        WHEN shape_differs(s) THEN 'shape_mismatch'
        WHEN s.kernel.error IS NOT NULL THEN 'error'
        WHEN dtype_differs(s) THEN 'dtype_mismatch'
        WHEN s.compared AND s.kernel.equal_count = s.kernel.numel THEN 'match'
        WHEN s.compared THEN 'mismatch'
        WHEN s.stats_equal THEN 'stats_only_match'
        ELSE 'stats_only_mismatch'
    END;

-- a pair's message: its status in words, a dtype difference, how statistics-only rows were
-- compared (`stats_text`, each comparison's own), differing NaN positions, a kernel error
CREATE OR REPLACE TEMP MACRO pair_message(s, stats_text) AS
    concat_ws('; ',
        CASE s.status
            WHEN 'only_in_a' THEN
                CASE WHEN s.absent_a THEN 'missing in run B (None in run A)' ELSE 'missing in run B' END
            WHEN 'only_in_b' THEN
                CASE WHEN s.absent_b THEN 'missing in run A (None in run B)' ELSE 'missing in run A' END
            WHEN 'absent_in_a' THEN 'None (not computed) in run A, a value in run B'
            WHEN 'absent_in_b' THEN 'a value in run A, None (not computed) in run B'
            WHEN 'absent_in_both' THEN 'None (not computed) in both runs'
            WHEN 'shape_mismatch' THEN format('shape {} in A, {} in B: not compared element-wise',
                                              CAST(s.shape_a AS VARCHAR), CAST(s.shape_b AS VARCHAR))
        END,
        CASE WHEN dtype_differs(s)
             THEN format('dtype {} in A, {} in B (compared after widening both)', s.dtype_a, s.dtype_b) END,
        stats_text,
        CASE WHEN coalesce(s.kernel.nan_mismatch_count, 0) > 0
             THEN format('{} NaN position(s) differ', s.kernel.nan_mismatch_count) END,
        s.kernel.error
    );
