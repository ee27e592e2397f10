-- key_data: one row per pair with its status, element metrics (where tensors were compared)
-- and both sides' statistics, in (step, dataflow order, rank, micro_step, index) order.
-- Tables: pairs (key_data_pairs.sql, given as a CTE or a table), pair_results (element kernel
-- results by (file_a, file_b)), key_order (dataflow).
-- Parameters: $stats_rtol (relative tolerance for statistics-only rows), $unknown_position (the
-- flow_position of keys not in key_order: one past its last position).
WITH joined AS (
    SELECT p.*, r.numel AS compared_numel, r.equal_count, r.first_mismatch_index, r.max_abs_err,
           r.max_rel_err, r.within_1e3_count, r.within_1e2_count, r.cosine, r.nan_mismatch_count,
           r.error, r.file_a IS NOT NULL AS compared,
           dtype_a IS NOT NULL AND dtype_b IS NOT NULL AND dtype_a <> dtype_b AS dtype_differs,
           coalesce(shape_a <> shape_b, false) AS shape_differs
    FROM pairs AS p
    LEFT JOIN pair_results AS r ON r.file_a = p.file_a AND r.file_b = p.file_b
),
stats_agree AS (
    SELECT *,
        CASE
            WHEN hash_a IS NOT NULL AND hash_b IS NOT NULL THEN hash_a = hash_b
            ELSE coalesce(
                     (min_a = min_b OR abs(min_a - min_b) <= $stats_rtol * greatest(abs(min_a), abs(min_b)))
                 AND (max_a = max_b OR abs(max_a - max_b) <= $stats_rtol * greatest(abs(max_a), abs(max_b)))
                 AND (mean_a = mean_b OR abs(mean_a - mean_b) <= $stats_rtol * greatest(abs(mean_a), abs(mean_b)))
                 AND (norm_a = norm_b OR abs(norm_a - norm_b) <= $stats_rtol * greatest(abs(norm_a), abs(norm_b))),
                 -- a statistic missing on both sides (an empty tensor's min) agrees
                 (min_a IS NULL AND min_b IS NULL AND norm_a IS NOT DISTINCT FROM norm_b))
        END AS stats_equal
    FROM joined
),
statused AS (
    SELECT *,
        CASE
            WHEN NOT in_b THEN 'only_in_a'
            WHEN NOT in_a THEN 'only_in_b'
            WHEN absent_a AND absent_b THEN 'absent_in_both'
            WHEN absent_a THEN 'absent_in_a'
            WHEN absent_b THEN 'absent_in_b'
            WHEN shape_differs THEN 'shape_mismatch'
            WHEN error IS NOT NULL THEN 'error'
            WHEN dtype_differs THEN 'dtype_mismatch'
            WHEN compared AND equal_count = compared_numel THEN 'match'
            WHEN compared THEN 'mismatch'
            WHEN stats_equal THEN 'stats_only_match'
            ELSE 'stats_only_mismatch'
        END AS status
    FROM stats_agree
)
SELECT
    s.key, s.step, s.rank, s.micro_step, s."index", s.status,
    s.shape_a, s.shape_b, s.dtype_a, s.dtype_b,
    coalesce(s.compared_numel, s.numel_a, s.numel_b)                      AS numel,
    s.equal_count,
    CASE WHEN s.compared THEN
        CASE WHEN s.compared_numel = 0 THEN 100.0 ELSE 100.0 * s.equal_count / s.compared_numel END
    END                                                                   AS same_pct,
    s.first_mismatch_index, s.max_abs_err, s.max_rel_err,
    CASE WHEN s.compared THEN
        CASE WHEN s.compared_numel = 0 THEN 100.0 ELSE 100.0 * s.within_1e3_count / s.compared_numel END
    END                                                                   AS within_1e3_pct,
    CASE WHEN s.compared THEN
        CASE WHEN s.compared_numel = 0 THEN 100.0 ELSE 100.0 * s.within_1e2_count / s.compared_numel END
    END                                                                   AS within_1e2_pct,
    s.cosine, s.nan_mismatch_count,
    concat_ws('; ',
        CASE s.status
            WHEN 'only_in_a' THEN CASE WHEN s.absent_a THEN 'missing in run B (None in run A)' ELSE 'missing in run B' END
            WHEN 'only_in_b' THEN CASE WHEN s.absent_b THEN 'missing in run A (None in run B)' ELSE 'missing in run A' END
            WHEN 'absent_in_a' THEN 'None (not computed) in run A, a value in run B'
            WHEN 'absent_in_b' THEN 'a value in run A, None (not computed) in run B'
            WHEN 'absent_in_both' THEN 'None (not computed) in both runs'
            WHEN 'shape_mismatch' THEN format('shape {} in A, {} in B: not compared element-wise',
                                              CAST(s.shape_a AS VARCHAR), CAST(s.shape_b AS VARCHAR))
        END,
        CASE WHEN s.dtype_differs THEN format('dtype {} in A, {} in B (compared after widening both)', s.dtype_a, s.dtype_b) END,
        CASE WHEN s.status NOT IN ('only_in_a', 'only_in_b', 'shape_mismatch', 'absent_in_a', 'absent_in_b',
                                   'absent_in_both') AND NOT s.compared
                  AND (s.file_a IS NULL OR s.file_b IS NULL)
             THEN CASE WHEN s.hash_a IS NOT NULL AND s.hash_b IS NOT NULL THEN 'statistics only: compared by hash'
                       ELSE 'statistics only: compared by min/max/mean/norm' END END,
        CASE WHEN coalesce(s.nan_mismatch_count, 0) > 0 THEN format('{} NaN position(s) differ', s.nan_mismatch_count) END,
        s.error
    )                                                                     AS message,
    s.min_a, s.min_b, s.max_a, s.max_b, s.mean_a, s.mean_b, s.norm_a, s.norm_b,
    s.nan_count_a, s.nan_count_b, s.inf_count_a, s.inf_count_b, s.zero_count_a, s.zero_count_b,
    s.hash_a, s.hash_b, s.file_a, s.file_b,
    coalesce(o.canonical, s.key)                                          AS canonical_key,
    coalesce(o.position, $unknown_position)       AS flow_position
FROM statused AS s
LEFT JOIN key_order AS o ON o.name = s.key
ORDER BY s.step, flow_position, s.key, s.rank, s.micro_step, s."index"
