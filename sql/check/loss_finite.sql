-- Check loss_finite (fails): every loss is finite. A loss is a saved key or logged scalar named
-- loss, pg_loss, vf_loss, policy_loss, value_loss or anything ending in "loss" (actor/pg_loss).
-- One row per non-finite loss, the first first. Reads: stats, scalars. No parameters.
SELECT 'key_data' AS source, key AS name, step, rank, micro_step, "index", min, max, mean
FROM stats
WHERE (key = 'loss' OR key LIKE '%loss') AND NOT coalesce(absent, false)
  AND (coalesce(nan_count, 0) + coalesce(inf_count, 0) > 0 OR NOT isfinite(max) OR NOT isfinite(min)
       OR NOT isfinite(mean))
UNION ALL
SELECT 'scalar', name, step, rank, NULL, NULL, value, value, value
FROM scalars
WHERE name LIKE '%loss' AND NOT isfinite(value)
ORDER BY step, micro_step NULLS LAST, rank, name
