-- Not a check: whether kl_first_step applies (one row, column applies): the config declares that the
-- reference starts as the actor, or the first step's ref_log_prob equals old_log_prob/log_prob
-- (see kl_first_step.sql, which repeats this rule). Reads: stats, run_info. No parameters.
WITH info AS (SELECT * FROM run_info),
first_step AS (SELECT * FROM stats WHERE step = (SELECT first_step FROM run_info) AND NOT coalesce(absent, false)),
first_ref AS (SELECT * FROM first_step WHERE canonical = 'ref_log_prob'),
first_actor AS (SELECT * FROM first_step WHERE canonical IN ('old_log_prob', 'log_prob')),
first_pairs AS (
  SELECT bool_or(CASE WHEN r.hash IS NOT NULL AND a.hash IS NOT NULL THEN r.hash = a.hash
                      ELSE r.max = a.max AND r.min = a.min AND r.mean = a.mean END) AS equal
  FROM first_ref AS r
  JOIN first_actor AS a ON a.rank = r.rank AND a.micro_step = r.micro_step AND a."index" = r."index"
  GROUP BY r.rank, r.micro_step, r."index"
)
SELECT coalesce(info.ref_starts_as_actor, (SELECT count(*) > 0 AND bool_and(coalesce(equal, false)) FROM first_pairs))
       AS applies,
       info.ref_starts_as_actor IS NOT NULL AS declared
FROM info
