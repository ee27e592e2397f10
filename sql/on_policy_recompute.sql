-- Within one run: log_prob and old_log_prob of the first micro-batch of a step are computed
-- by the same weights on the same data (on-policy), so they should be bitwise equal. Rows here
-- mean the actor's recomputation is not deterministic. Parameter: $stats, the name of one run's
-- key_data statistics table (stats_a or stats_b).
SELECT n.step, n.rank, n."index", n.hash AS log_prob_hash, o.hash AS old_log_prob_hash,
       n.max AS log_prob_max, o.max AS old_log_prob_max
FROM query_table($stats) AS n
JOIN query_table($stats) AS o
  ON o.step = n.step AND o.rank = n.rank AND o."index" = n."index" AND o.micro_step = n.micro_step
WHERE n.key IN ('log_prob', 'log_probs', 'log_probe') AND o.key IN ('old_log_prob', 'old_log_probs', 'old_log_probe')
  AND n.micro_step = 0
  AND NOT coalesce(n.absent, false) AND NOT coalesce(o.absent, false)  -- None (not computed) is no recomputation
  AND (CASE WHEN n.hash IS NOT NULL AND o.hash IS NOT NULL THEN n.hash <> o.hash
            ELSE n.max IS DISTINCT FROM o.max OR n.min IS DISTINCT FROM o.min OR n.mean IS DISTINCT FROM o.mean END)
ORDER BY n.step, n.rank
