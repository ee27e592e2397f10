-- Check entropy_collapse (warns): the policy's entropy (key entropy/entropies: the mean over the
-- step's tensors; else logged scalars whose name contains "entropy") falls below entropy_min_ratio
-- of its first step's value. Reads: stats, scalars.
-- param entropy_min_ratio = 0.1 : the share of the first step's entropy below which a step warns
WITH per_step AS (
  SELECT step, avg(mean) AS entropy, 'key_data' AS source FROM stats
  WHERE canonical = 'entropy' AND NOT coalesce(absent, false) GROUP BY step
  UNION ALL
  SELECT step, avg(value), 'scalar' FROM scalars
  WHERE name LIKE '%entropy%' AND NOT EXISTS (SELECT 1 FROM stats WHERE canonical = 'entropy')
  GROUP BY step
),
first AS (SELECT arg_min(entropy, step) AS entropy0 FROM per_step)
SELECT step, source, entropy, entropy0 AS first_step_entropy, entropy / nullif(entropy0, 0) AS ratio
FROM per_step CROSS JOIN first
WHERE entropy0 > 0 AND entropy < getvariable('entropy_min_ratio') * entropy0
ORDER BY step
