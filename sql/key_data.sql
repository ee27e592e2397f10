-- key_data: one row per pair with its status, element metrics (where tensors were compared)
-- and both sides' statistics, in (step, dataflow order, rank, micro_step, index) order.
-- Tables: selected_pairs (selected_pairs.sql: the selection's key_data_pairs), pair_results
-- (element kernel results by (file_a, file_b)), key_order (dataflow), key_tolerance ((key, dtype) -> rtol,
-- atol, stats_rtol, stats_atol, tolerance_source: rlprobe/comparison/tolerance.py), key_envelope ((canonical
-- key, step) -> control_rel_err, envelope: a control run's noise, rlprobe/comparison/control_run.py; empty
-- without one). Macros: pair_macros.sql.
-- A pair is judged by the tolerance of the dtype both runs saved it in (different dtypes stay
-- dtype_mismatch), or by the envelope of its key and step where that is larger: close where its
-- norm_rel_err is within either. Keys not in key_order come after its last position.
WITH joined AS (
    SELECT p.*, COLUMNS(r.* EXCLUDE (pair_id, file_a, file_b)) AS 'kernel_\0', r.file_a IS NOT NULL AS compared,
           coalesce(t.rtol, 0.0) AS rtol, coalesce(t.atol, 0.0) AS atol, coalesce(t.stats_rtol, 0.0) AS stats_rtol,
           coalesce(t.stats_atol, 0.0) AS stats_atol, t.tolerance_source,
           pair_scale(p.min_a, p.max_a, p.min_b, p.max_b) AS scale, e.control_rel_err, e.envelope
    FROM selected_pairs AS p
    LEFT JOIN pair_results AS r ON r.file_a = p.file_a AND r.file_b = p.file_b
    LEFT JOIN key_tolerance AS t ON t.key = p.key AND t.dtype = coalesce(p.dtype_a, p.dtype_b)
    LEFT JOIN key_order AS eo ON eo.name = p.key
    LEFT JOIN key_envelope AS e ON e.key = coalesce(eo.canonical, p.key) AND e.step = p.step
),
stats_agree AS (
    SELECT *,
        CASE
            WHEN hash_a IS NOT NULL AND hash_b IS NOT NULL THEN hash_a = hash_b
            ELSE coalesce(min_a = min_b AND max_a = max_b AND mean_a = mean_b AND norm_a = norm_b,
                          -- a statistic missing on both sides (an empty tensor's min) agrees
                          min_a IS NULL AND min_b IS NULL AND norm_a IS NOT DISTINCT FROM norm_b)
        END AS stats_equal,
        -- statistics-only rows only (a compared pair's statistics are not read for its status)
        CASE WHEN NOT compared THEN
            stats_close(min_a, min_b, max_a, max_b, mean_a, mean_b, norm_a, norm_b, nan_count_a, nan_count_b,
                        inf_count_a, inf_count_b, stats_rtol, stats_atol)
            -- exact statistics of other bits are no agreement where the tolerance is 0 (bitwise)
            AND NOT (coalesce(hash_a <> hash_b, false) AND stats_rtol = 0 AND stats_atol = 0) END AS stats_close,
        CASE WHEN compared THEN norm_rel_err(kernel_max_abs_err, scale)
             ELSE stats_rel_err(min_a, min_b, max_a, max_b, mean_a, mean_b, norm_a, norm_b) END AS norm_rel_err
    FROM joined
),
enveloped AS (
    -- the envelope where it is larger than the dtype tolerance's bound (NULL: the dtype tolerance judges)
    SELECT *,
        CASE WHEN envelope > tolerance_bound(scale, CASE WHEN compared THEN rtol ELSE stats_rtol END,
                                             CASE WHEN compared THEN atol ELSE stats_atol END)
             THEN envelope END AS control_envelope
    FROM stats_agree
),
statused AS (
    SELECT j.*, pair_status(j.in_a, j.in_b, j.absent_a, j.absent_b, j.shape_a, j.shape_b, j.dtype_a, j.dtype_b,
                           j.compared, j.kernel_error, j.kernel_numel, j.kernel_equal_count,
                           within_tolerance(j.kernel_max_abs_err, j.kernel_nan_mismatch_count, j.scale, j.rtol, j.atol)
                           OR (coalesce(j.kernel_nan_mismatch_count, 0) = 0
                               AND within_envelope(j.norm_rel_err, j.control_envelope)),
                           j.stats_equal,
                           j.stats_close OR (j.nan_count_a IS NOT DISTINCT FROM j.nan_count_b
                                             AND j.inf_count_a IS NOT DISTINCT FROM j.inf_count_b
                                             AND within_envelope(j.norm_rel_err, j.control_envelope))) AS status
    FROM enveloped AS j
)
SELECT
    s.key, s.step, s.rank, s.micro_step, s."index", s.status,
    s.shape_a, s.shape_b, s.dtype_a, s.dtype_b,
    unnest(compared_metrics(s.compared, s.kernel_numel, s.numel_a, s.numel_b, s.kernel_equal_count,
                            s.kernel_first_mismatch_index, s.kernel_max_abs_err, s.kernel_max_rel_err,
                            s.kernel_within_1e3_count, s.kernel_within_1e2_count, s.kernel_cosine,
                            s.kernel_nan_mismatch_count)),
    -- the measure of the tolerance (its rtol, atol and source per (key, dtype) are key_tolerance's: columns
    -- per row cost the reports ~15% of the output phase of 25,600 pairs)
    s.norm_rel_err,
    concat_ws('; ', nullif(pair_message(s.status, s.absent_a, s.absent_b, s.shape_a, s.shape_b, s.dtype_a, s.dtype_b,
        CASE WHEN s.status NOT IN ('only_in_a', 'only_in_b', 'shape_mismatch', 'absent_in_a', 'absent_in_b',
                                   'absent_in_both') AND NOT s.compared
                  AND (s.file_a IS NULL OR s.file_b IS NULL)
             THEN CASE WHEN s.hash_a IS NOT NULL AND s.hash_b IS NOT NULL AND s.hash_a = s.hash_b
                           THEN 'statistics only: compared by hash'
                       WHEN s.hash_a IS NOT NULL AND s.hash_b IS NOT NULL
                           THEN 'statistics only: bits differ (hash), compared by min/max/mean/norm'
                       ELSE 'statistics only: compared by min/max/mean/norm' END END,
        s.kernel_nan_mismatch_count, s.kernel_error), ''),
        -- a close pair is within the envelope's words where that judged it; one beyond gets both
        CASE WHEN s.control_envelope IS NULL OR s.status NOT IN ('close', 'stats_only_close')
             THEN tolerance_text(s.status, s.dtype_a, s.norm_rel_err,
                                 CASE WHEN s.compared THEN s.rtol ELSE s.stats_rtol END, s.tolerance_source) END,
        envelope_text(s.status, s.norm_rel_err, s.control_envelope, s.control_rel_err)
    )                                                                     AS message,
    COLUMNS(lambda c: side_statistic(c)),
    s.control_envelope,
    coalesce(o.canonical, s.key)                                          AS canonical_key,
    coalesce(o.position, (SELECT coalesce(max(position) + 1, 0) FROM key_order)) AS flow_position
FROM statused AS s
LEFT JOIN key_order AS o ON o.name = s.key
ORDER BY s.step, flow_position, s.key, s.rank, s.micro_step, s."index"
