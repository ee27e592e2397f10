-- modules: one row per module tensor pair with its status, element metrics (where tensors were
-- saved in both runs) and both sides' statistics, in run A's execution order
-- (step, seq, then inputs before outputs; for backward grad_output before grad_input).
-- Tables: module_pairs (module_pairs.sql), module_results (element kernel),
--         module_tolerance (dtype -> relative tolerance of statistics-only rows).
-- Parameter: $stats_rtol (NULL = the dtype's tolerance from module_tolerance).
WITH joined AS (
    SELECT p.*, r.numel AS compared_numel, r.equal_count, r.first_mismatch_index, r.max_abs_err,
           r.max_rel_err, r.within_1e3_count, r.within_1e2_count, r.cosine, r.nan_mismatch_count,
           r.error, r.pair_id IS NOT NULL AS compared,
           dtype_a IS NOT NULL AND dtype_b IS NOT NULL AND dtype_a <> dtype_b AS dtype_differs,
           coalesce(shape_a <> shape_b, false) AS shape_differs,
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
    SELECT *,
        CASE
            WHEN NOT in_b THEN 'only_in_a'
            WHEN NOT in_a THEN 'only_in_b'
            WHEN shape_differs THEN 'shape_mismatch'
            WHEN error IS NOT NULL THEN 'error'
            WHEN dtype_differs THEN 'dtype_mismatch'
            WHEN compared AND equal_count = compared_numel THEN 'match'
            WHEN compared THEN 'mismatch'
            WHEN stats_equal THEN 'stats_only_match'
            ELSE 'stats_only_mismatch'
        END AS status,
        CASE io WHEN 'input' THEN 0 WHEN 'output' THEN 1 WHEN 'grad_output' THEN 2 WHEN 'grad_input' THEN 3 ELSE 4 END
            AS io_order
    FROM stats_agree
)
SELECT
    s.stage, s.step, s.rank, s.module, s.call, s.direction, s.io, s."index",
    coalesce(s.seq_a, s.seq_b)                                            AS seq,
    s.seq_b, s.status,
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
            WHEN 'only_in_a' THEN 'missing in run B'
            WHEN 'only_in_b' THEN 'missing in run A'
            WHEN 'shape_mismatch' THEN format('shape {} in A, {} in B: not compared element-wise',
                                              CAST(s.shape_a AS VARCHAR), CAST(s.shape_b AS VARCHAR))
        END,
        CASE WHEN s.dtype_differs THEN format('dtype {} in A, {} in B (compared after widening both)', s.dtype_a, s.dtype_b) END,
        CASE WHEN s.status NOT IN ('only_in_a', 'only_in_b', 'shape_mismatch') AND NOT s.compared
             THEN CASE WHEN s.hash_a IS NOT NULL AND s.hash_b IS NOT NULL AND s.hash_a = s.hash_b
                           THEN 'statistics only: compared by hash'
                       WHEN s.hash_a IS NOT NULL AND s.hash_b IS NOT NULL AND s.rtol = 0
                           THEN 'statistics only: compared by hash (bits differ)'
                       ELSE format('statistics only: compared by min/max/mean/norm, rtol {}', s.rtol) END END,
        CASE WHEN coalesce(s.nan_mismatch_count, 0) > 0 THEN format('{} NaN position(s) differ', s.nan_mismatch_count) END,
        s.error
    )                                                                     AS message,
    s.min_a, s.min_b, s.max_a, s.max_b, s.mean_a, s.mean_b, s.norm_a, s.norm_b,
    s.nan_count_a, s.nan_count_b, s.inf_count_a, s.inf_count_b, s.zero_count_a, s.zero_count_b,
    s.hash_a, s.hash_b, s.file_a, s.file_b, s.io_order
FROM statused AS s
ORDER BY s.step, coalesce(s.seq_a, s.seq_b), s.io_order, s.rank, s.stage, s."index"
