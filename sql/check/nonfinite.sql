-- Check nonfinite (fails): no NaN or inf in any saved key or logged scalar. One row per offending
-- tensor or scalar, the first occurrence first (step, micro_step, rank, name); rlprobe check adds the
-- first non-finite element's position from the tensor where it was saved.
-- Reads: stats (key-data statistics; msprobe dumps have no counts, so their NaN/inf min/max/mean
-- are read instead), scalars. No parameters.
SELECT 'key_data' AS source, key AS name, step, rank, micro_step, "index", nan_count, inf_count, min, max, mean
FROM stats
WHERE NOT coalesce(absent, false)
  AND (coalesce(nan_count, 0) > 0 OR coalesce(inf_count, 0) > 0
       OR (nan_count IS NULL AND (isnan(max) OR isinf(max) OR isnan(min) OR isinf(min) OR isnan(mean))))
UNION ALL
SELECT 'scalar', name, step, rank, NULL, NULL, CAST(isnan(value) AS BIGINT), CAST(isinf(value) AS BIGINT),
       value, value, value
FROM scalars
WHERE NOT isfinite(value)
ORDER BY step, micro_step NULLS LAST, rank, name, "index"
