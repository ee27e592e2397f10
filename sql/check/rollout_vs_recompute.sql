-- Check rollout_vs_recompute (fails): the rollout engine's log-probs of the sampled tokens
-- (rollout_log_prob; verl rollout_log_probs, TRL sampling_per_token_logps) agree with the trainer's
-- recomputation of the same tokens: old_log_prob, or log_prob at an on-policy micro-batch (micro-step
-- 0 of a generating step, see on_policy.sql) where no old_log_prob is saved. Token level, rollout and
-- trainer rows are paired by sample where the dump saved sample identity (TRL saves the rollout and the
-- shuffled update micro-batches in different calls; rlprobe/checks/sample_pairs.py), else within one
-- save call. One row per step and rank that exceeds a threshold. Token level (token_steps: masked by
-- the response mask where saved; Δ = rollout - trainer): mean |Δ|, the share of tokens whose ratio exp(Δ) is outside [1-eps, 1+eps]
-- (eps: the run's clip range from its config, else 0.2; `--param eps=...`), max |Δ|. Statistics
-- level (no tensors): |mean(rollout) - mean(trainer)| per batch saved in one call, a lower bound of
-- mean |Δ| (statistics-only dumps whose rollout and trainer calls differ are not compared).
-- Reads: stats, run_info, token_steps.
-- param max_mean_abs_delta = 0.001 : largest mean |Δ| (nats) a step may show
-- param max_outside_share = 0.001 : largest share of tokens whose ratio is outside [1-eps, 1+eps]
-- param max_abs_delta = 0.1 : largest |Δ| of any token
WITH info AS (SELECT * FROM run_info),
tokens AS (
  SELECT t.pair, t.step, t.rank, 'tokens' AS level, t.dtype_a AS trainer_dtype, t.dtype_b AS rollout_dtype,
         t.tokens, t.mean_delta, t.sd_delta, t.mean_abs, t.p50_abs, t.p95_abs, t.p99_abs, t.max_abs, t.eps,
         t.outside_share
  FROM token_steps AS t CROSS JOIN info
  WHERE t.pair = 'rollout_vs_old'
     OR (t.pair = 'rollout_vs_log_prob' AND (t.step - info.first_step) % info.generation_every = 0)
),
rollout AS (
  SELECT * FROM stats WHERE canonical = 'rollout_log_prob' AND NOT coalesce(absent, false)
),
trainer AS (
  SELECT * FROM stats WHERE canonical IN ('old_log_prob', 'log_prob') AND NOT coalesce(absent, false)
),
with_old AS (SELECT DISTINCT step, rank, micro_step FROM trainer WHERE canonical = 'old_log_prob'),
with_tokens AS (SELECT DISTINCT step, rank FROM token_steps WHERE pair IN ('rollout_vs_old', 'rollout_vs_log_prob')),
stat_pairs AS (
  SELECT CASE WHEN o.canonical = 'old_log_prob' THEN 'rollout_vs_old' ELSE 'rollout_vs_log_prob' END AS pair,
         r.step, r.rank, 'statistics' AS level, o.dtype AS trainer_dtype, r.dtype AS rollout_dtype,
         r.numel AS tokens, r.mean - o.mean AS mean_delta, abs(r.mean - o.mean) AS mean_abs_lower_bound,
         o.canonical AS trainer_key
  FROM rollout AS r
  JOIN trainer AS o ON o.step = r.step AND o.rank = r.rank AND o.micro_step = r.micro_step AND o."index" = r."index"
  CROSS JOIN info
  ANTI JOIN with_tokens AS w ON w.step = r.step AND w.rank = r.rank
  LEFT JOIN with_old AS x ON x.step = r.step AND x.rank = r.rank AND x.micro_step = r.micro_step
  WHERE r.shape IS NOT DISTINCT FROM o.shape
    AND (o.canonical = 'old_log_prob'
         OR (o.canonical = 'log_prob' AND x.step IS NULL AND r.micro_step = 0
             AND (r.step - info.first_step) % info.generation_every = 0))
),
stats_level AS (
  SELECT pair, step, rank, level, any_value(trainer_dtype) AS trainer_dtype, any_value(rollout_dtype) AS rollout_dtype,
         sum(tokens) AS tokens, max(mean_abs_lower_bound) AS mean_abs_lower_bound
  FROM stat_pairs GROUP BY pair, step, rank, level
)
SELECT pair, step, rank, level, trainer_dtype, rollout_dtype, tokens, mean_delta, sd_delta, mean_abs, p50_abs,
       p95_abs, p99_abs, max_abs, eps, outside_share
FROM tokens
WHERE mean_abs > getvariable('max_mean_abs_delta') OR outside_share > getvariable('max_outside_share')
   OR max_abs > getvariable('max_abs_delta') OR isnan(mean_abs)
UNION ALL
SELECT pair, step, rank, level, trainer_dtype, rollout_dtype, tokens, NULL, NULL, mean_abs_lower_bound, NULL,
       NULL, NULL, NULL, NULL, NULL
FROM stats_level
WHERE mean_abs_lower_bound > getvariable('max_mean_abs_delta') OR isnan(mean_abs_lower_bound)
ORDER BY step, rank, pair
