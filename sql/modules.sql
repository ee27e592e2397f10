-- modules: one row per module tensor pair with its status, element metrics (where tensors were
-- saved in both runs) and both sides' statistics, in run A's execution order
-- (step, seq, then inputs before outputs; for backward grad_output before grad_input).
-- Tables: module_pairs (module_pairs.sql), module_results (element kernel),
--         module_tolerance (dtype -> rtol, atol, stats_rtol, stats_atol: the comparison's tolerance,
--         rlprobe/comparison/tolerance.py; a dtype not in it is exact). Macros: pair_macros.sql.
-- The rule is key data's (sql/key_data.sql): close within atol + rtol * scale, statistics-only rows each
-- statistic within it.
WITH joined AS (
    SELECT p.*, COLUMNS(r.* EXCLUDE (pair_id)) AS 'kernel_\0', r.pair_id IS NOT NULL AS compared,
           coalesce(t.rtol, 0.0) AS rtol, coalesce(t.atol, 0.0) AS atol, coalesce(t.stats_rtol, 0.0) AS stats_rtol,
           coalesce(t.stats_atol, 0.0) AS stats_atol, pair_scale(p.min_a, p.max_a, p.min_b, p.max_b) AS scale
    FROM module_pairs AS p
    LEFT JOIN module_results AS r USING (pair_id)
    LEFT JOIN module_tolerance AS t ON t.dtype = coalesce(p.dtype_a, p.dtype_b)
),
stats_agree AS (
    SELECT *,
        coalesce(hash_a IS NOT NULL AND hash_b IS NOT NULL AND hash_a = hash_b, false)
            OR coalesce((hash_a IS NULL OR hash_b IS NULL) AND min_a = min_b AND max_a = max_b AND mean_a = mean_b
                        AND norm_a = norm_b AND nan_count_a IS NOT DISTINCT FROM nan_count_b
                        AND inf_count_a IS NOT DISTINCT FROM inf_count_b,
                        min_a IS NULL AND min_b IS NULL AND norm_a IS NOT DISTINCT FROM norm_b) AS stats_equal,
        stats_close(min_a, min_b, max_a, max_b, mean_a, mean_b, norm_a, norm_b, nan_count_a, nan_count_b,
                    inf_count_a, inf_count_b, stats_rtol, stats_atol)
            -- exact statistics of other bits are no agreement where the tolerance is 0 (bitwise)
            AND NOT (coalesce(hash_a <> hash_b, false) AND stats_rtol = 0 AND stats_atol = 0) AS stats_close,
        CASE WHEN compared THEN norm_rel_err(kernel_max_abs_err, scale)
             ELSE stats_rel_err(min_a, min_b, max_a, max_b, mean_a, mean_b, norm_a, norm_b) END AS norm_rel_err
    FROM joined
),
statused AS (
    SELECT j.*, pair_status(j.in_a, j.in_b, j.absent_a, j.absent_b, j.shape_a, j.shape_b, j.dtype_a, j.dtype_b,
                           j.compared, j.kernel_error, j.kernel_numel, j.kernel_equal_count,
                           within_tolerance(j.kernel_max_abs_err, j.kernel_nan_mismatch_count, j.scale, j.rtol, j.atol),
                           j.stats_equal, j.stats_close) AS status,
        CASE j.io WHEN 'input' THEN 0 WHEN 'output' THEN 1 WHEN 'grad_output' THEN 2 WHEN 'grad_input' THEN 3
                  ELSE 4 END AS io_order
    FROM stats_agree AS j
)
SELECT
    s.stage, s.step, s.rank, s.module, s.call, s.direction, s.io, s."index",
    coalesce(s.seq_a, s.seq_b)                                            AS seq,
    s.seq_b, s.status,
    s.shape_a, s.shape_b, s.dtype_a, s.dtype_b,
    unnest(compared_metrics(s.compared, s.kernel_numel, s.numel_a, s.numel_b, s.kernel_equal_count,
                            s.kernel_first_mismatch_index, s.kernel_max_abs_err, s.kernel_max_rel_err,
                            s.kernel_within_1e3_count, s.kernel_within_1e2_count, s.kernel_cosine,
                            s.kernel_nan_mismatch_count)),
    s.norm_rel_err,
    CASE WHEN s.compared THEN s.rtol ELSE s.stats_rtol END                AS rtol,
    concat_ws('; ', nullif(pair_message(s.status, s.absent_a, s.absent_b, s.shape_a, s.shape_b, s.dtype_a, s.dtype_b,
        CASE WHEN s.status NOT IN ('only_in_a', 'only_in_b', 'shape_mismatch') AND NOT s.compared
             THEN CASE WHEN s.hash_a IS NOT NULL AND s.hash_b IS NOT NULL AND s.hash_a = s.hash_b
                           THEN 'statistics only: compared by hash'
                       WHEN s.hash_a IS NOT NULL AND s.hash_b IS NOT NULL AND s.stats_rtol = 0
                           THEN 'statistics only: compared by hash (bits differ)'
                       ELSE format('statistics only: compared by min/max/mean/norm, rtol {}', s.stats_rtol) END END,
        s.kernel_nan_mismatch_count, s.kernel_error), ''),
        tolerance_text(s.status, s.dtype_a, s.norm_rel_err, CASE WHEN s.compared THEN s.rtol ELSE s.stats_rtol END,
                       s.dtype_a || ' default')
    )                                                                     AS message,
    COLUMNS(lambda c: side_statistic(c)),
    s.io_order
FROM statused AS s
ORDER BY s.step, coalesce(s.seq_a, s.seq_b), s.io_order, s.rank, s.stage, s."index"
