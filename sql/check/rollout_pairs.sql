-- Not a check: whether rollout_vs_recompute has anything to compare (one row, column pairs): a
-- token-level rollout pair (token_steps) or a statistics-level one, rollout_log_prob saved in the
-- same call as old_log_prob/log_prob with the same shape (see rollout_vs_recompute.sql, whose
-- stat_pairs this repeats without
-- its generating-step filter). EXISTS stops at the first pair found, so
-- learning applicability costs far less than running the check. Reads: stats, token_steps.
SELECT EXISTS (SELECT 1 FROM token_steps WHERE pair IN ('rollout_vs_old', 'rollout_vs_log_prob'))
    OR EXISTS (SELECT 1
               FROM stats AS r
               JOIN stats AS o ON o.step = r.step AND o.rank = r.rank AND o.micro_step = r.micro_step
                              AND o."index" = r."index"
               WHERE r.canonical = 'rollout_log_prob' AND NOT coalesce(r.absent, false)
                 AND o.canonical IN ('old_log_prob', 'log_prob') AND NOT coalesce(o.absent, false)
                 AND r.shape IS NOT DISTINCT FROM o.shape
                 AND (o.canonical = 'old_log_prob' OR r.micro_step = 0)) AS pairs
