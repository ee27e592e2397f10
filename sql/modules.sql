-- modules: one row per module tensor pair with its status, element metrics (where tensors were
-- saved in both runs) and both sides' statistics, in run A's execution order
-- (step, seq, then inputs before outputs; for backward grad_output before grad_input).
-- Tables: module_pairs (module_pairs.sql), module_results (element kernel),
--         module_tolerance (dtype -> relative tolerance of statistics-only rows).
-- Macros: pair_macros.sql. Parameter: $stats_rtol (NULL = the dtype's tolerance from module_tolerance).
WITH joined AS (
    SELECT p.*, COLUMNS(r.* EXCLUDE (pair_id)) AS 'kernel_\0', r.pair_id IS NOT NULL AS compared,
           coalesce($stats_rtol, t.rtol, 0.0) AS rtol
    FROM module_pairs AS p
    LEFT JOIN module_results AS r USING (pair_id)
    LEFT JOIN module_tolerance AS t ON t.dtype = coalesce(p.dtype_a, p.dtype_b)
),
stats_agree AS (
    SELECT *,
        CASE
            WHEN hash_a IS NOT NULL AND hash_b IS NOT NULL AND hash_a = hash_b THEN true
            -- bits differ: only a dtype with a tolerance (bf16, fp16, fp8) may still agree by its statistics
            WHEN hash_a IS NOT NULL AND hash_b IS NOT NULL AND rtol = 0 THEN false
            ELSE coalesce(
                     (min_a = min_b OR abs(min_a - min_b) <= rtol * greatest(abs(min_a), abs(min_b)))
                 AND (max_a = max_b OR abs(max_a - max_b) <= rtol * greatest(abs(max_a), abs(max_b)))
                 AND (mean_a = mean_b OR abs(mean_a - mean_b) <= rtol * greatest(abs(mean_a), abs(mean_b)))
                 AND (norm_a = norm_b OR abs(norm_a - norm_b) <= rtol * greatest(abs(norm_a), abs(norm_b)))
                 AND nan_count_a IS NOT DISTINCT FROM nan_count_b
                 AND inf_count_a IS NOT DISTINCT FROM inf_count_b,
                 (min_a IS NULL AND min_b IS NULL AND norm_a IS NOT DISTINCT FROM norm_b))
        END AS stats_equal
    FROM joined
),
statused AS (
    SELECT j.*, pair_status(j.in_a, j.in_b, j.absent_a, j.absent_b, j.shape_a, j.shape_b, j.dtype_a, j.dtype_b,
                           j.compared, j.kernel_error, j.kernel_numel, j.kernel_equal_count, j.stats_equal) AS status,
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
    pair_message(s.status, s.absent_a, s.absent_b, s.shape_a, s.shape_b, s.dtype_a, s.dtype_b,
        CASE WHEN s.status NOT IN ('only_in_a', 'only_in_b', 'shape_mismatch') AND NOT s.compared
             THEN CASE WHEN s.hash_a IS NOT NULL AND s.hash_b IS NOT NULL AND s.hash_a = s.hash_b
                           THEN 'statistics only: compared by hash'
                       WHEN s.hash_a IS NOT NULL AND s.hash_b IS NOT NULL AND s.rtol = 0
                           THEN 'statistics only: compared by hash (bits differ)'
                       ELSE format('statistics only: compared by min/max/mean/norm, rtol {}', s.rtol) END END,
        s.kernel_nan_mismatch_count, s.kernel_error
    )                                                                     AS message,
    COLUMNS(lambda c: side_statistic(c)),
    s.io_order
FROM statused AS s
ORDER BY s.step, coalesce(s.seq_a, s.seq_b), s.io_order, s.rank, s.stage, s."index"
