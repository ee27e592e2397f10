-- key_envelope: per (canonical key, step), the largest max-norm relative error of run A against control run C
-- (A-vs-C's key_data: norm_rel_err; of statistics-only rows, their largest statistic difference) and the
-- envelope, $factor times it, that sql/key_data.sql judges A against B by (rlprobe/comparison/control_run.py);
-- `source`: $source, the tolerance's source as the reports name it.
-- None for exact keys (key_tolerance's exact: tokens, integers), for rows without a measure (missing on a
-- side, absent, other shapes or dtypes, a kernel error, NaN), nor from $parted_step on (C's tokens parted).
-- Tables: key_data, key_tolerance (of the A-vs-C comparison).
SELECT k.canonical_key AS key, k.step, max(k.norm_rel_err) AS control_rel_err,
       $factor * max(k.norm_rel_err) AS envelope, $source AS source
FROM key_data AS k
JOIN key_tolerance AS t ON t.key = k.key AND t.dtype = coalesce(k.dtype_a, k.dtype_b)
WHERE k.step >= 0 AND NOT t.exact
  AND k.status IN ('match', 'close', 'mismatch', 'stats_only_match', 'stats_only_close', 'stats_only_mismatch')
  AND isfinite(k.norm_rel_err)
  AND (CAST($parted_step AS BIGINT) IS NULL OR k.step < CAST($parted_step AS BIGINT))
GROUP BY k.canonical_key, k.step
ORDER BY k.step, k.canonical_key
