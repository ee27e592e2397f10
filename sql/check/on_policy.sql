-- Check on_policy (fails): where the run is on-policy, the trainer's log_prob equals its old_log_prob
-- (the importance ratio is 1) within a dtype-aware tolerance. On-policy means: micro-step 0 (the
-- first micro-batch) of a step that generates (step - first_step is a multiple of run_info's
-- generation_every, read from the config: TRL's steps_per_generation x num_iterations /
-- gradient_accumulation_steps, else 1), and, where an epoch/iteration index (epoch, ppo_epoch,
-- iteration) is saved in that call, its first epoch (the index is 0). Pairs of different shapes are
-- never compared. Tolerance (tolerance_per_ulp is that of one ulp, so a caller can judge the rows of
-- on_policy_ulps 0 at another count without reading the tensors again): on_policy_ulps x the machine epsilon of the coarser dtype of the two
-- (float64 2.2e-16, float32 1.19e-7, float16 9.8e-4, bfloat16 7.8e-3) x max(1, the largest |log-prob|).
-- Token level (token_steps, pair on_policy): the largest |log_prob - old_log_prob| over the batch's
-- tokens; statistics level (no tensors): the differences of max, min and mean.
-- Reads: stats, run_info, token_steps. Aliases: per_token_logps, old_per_token_logps, ...
-- param on_policy_ulps = 16 : how many machine epsilons (of the value's magnitude) on-policy pairs may differ
WITH info AS (SELECT * FROM run_info),
n AS (SELECT * FROM stats WHERE canonical = 'log_prob' AND micro_step = 0 AND NOT coalesce(absent, false)),
o AS (SELECT * FROM stats WHERE canonical = 'old_log_prob' AND micro_step = 0 AND NOT coalesce(absent, false)),
later_epochs AS (SELECT DISTINCT step, rank FROM stats
                 WHERE canonical = 'epoch' AND micro_step = 0 AND coalesce(max, 0) <> 0),
pairs AS (
  SELECT n.step, n.rank, n."index", n.dtype AS dtype_a, o.dtype AS dtype_b, n.shape,
         greatest(1.0, abs(n.min), abs(n.max), abs(o.min), abs(o.max)) AS magnitude,
         greatest(abs(n.max - o.max), abs(n.min - o.min), abs(n.mean - o.mean)) AS stats_diff,
         n.hash IS NOT NULL AND n.hash = o.hash AS bitwise_equal
  FROM n
  JOIN o ON o.step = n.step AND o.rank = n.rank AND o."index" = n."index"
  CROSS JOIN info
  ANTI JOIN later_epochs AS e ON e.step = n.step AND e.rank = n.rank
  WHERE n.shape IS NOT DISTINCT FROM o.shape AND (n.step - info.first_step) % info.generation_every = 0
),
judged AS (
  SELECT p.*, t.max_abs AS token_max_abs, t.tokens,
         p.magnitude * greatest(
           CASE WHEN lower(p.dtype_a) LIKE '%bfloat16%' OR lower(p.dtype_b) LIKE '%bfloat16%' THEN 0.0078125
                WHEN lower(p.dtype_a) LIKE '%float16%' OR lower(p.dtype_b) LIKE '%float16%' THEN 0.0009765625
                WHEN lower(p.dtype_a) LIKE '%float64%' AND lower(p.dtype_b) LIKE '%float64%' THEN 2.220446049250313e-16
                ELSE 1.1920928955078125e-07 END, 0) AS tolerance_per_ulp
  FROM pairs AS p
  LEFT JOIN token_steps AS t ON t.pair = 'on_policy' AND t.step = p.step AND t.rank = p.rank
)
SELECT step, rank, "index", dtype_a AS log_prob_dtype, dtype_b AS old_log_prob_dtype,
       CASE WHEN token_max_abs IS NOT NULL THEN 'tokens' ELSE 'statistics' END AS level,
       coalesce(token_max_abs, stats_diff) AS max_abs_diff,
       getvariable('on_policy_ulps') * tolerance_per_ulp AS tolerance, tolerance_per_ulp, tokens
FROM judged
WHERE NOT bitwise_equal
  AND (coalesce(token_max_abs, stats_diff) > getvariable('on_policy_ulps') * tolerance_per_ulp OR coalesce(token_max_abs, stats_diff) IS NULL
       OR isnan(coalesce(token_max_abs, stats_diff)))
ORDER BY step, rank, "index"
