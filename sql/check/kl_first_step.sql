-- Check kl_first_step (fails): at the run's first step, when the reference model starts as the actor,
-- the KL between them (key kl; verl/OpenRLHF kl_penalty) is 0. That the reference starts as the actor
-- is declared by a config leaf `ref_starts_as_actor: true` (or `--param ref_starts_as_actor=true`),
-- or, without a declaration, detected from the first step's saved log-probs: ref_log_prob equals
-- old_log_prob (else log_prob) bitwise (equal hashes; equal min/max/mean where no hash is saved) in
-- every batch of the first step. One row per kl tensor of the first step whose largest |value|
-- exceeds kl_first_step_tol. Reads: stats, run_info (ref_starts_as_actor, first_step).
-- param kl_first_step_tol = 1e-06 : the largest |KL| allowed at the first step
WITH info AS (SELECT * FROM run_info),
first_step AS (SELECT * FROM stats WHERE step = (SELECT first_step FROM run_info) AND NOT coalesce(absent, false)),
first_ref AS (SELECT * FROM first_step WHERE canonical = 'ref_log_prob'),
first_actor AS (SELECT * FROM first_step WHERE canonical IN ('old_log_prob', 'log_prob')),
first_pairs AS (
  SELECT r.rank, r.micro_step, r."index",
         bool_or(CASE WHEN r.hash IS NOT NULL AND a.hash IS NOT NULL THEN r.hash = a.hash
                      ELSE r.max = a.max AND r.min = a.min AND r.mean = a.mean END) AS equal
  FROM first_ref AS r
  JOIN first_actor AS a ON a.rank = r.rank AND a.micro_step = r.micro_step AND a."index" = r."index"
  GROUP BY r.rank, r.micro_step, r."index"
),
applies AS (
  SELECT coalesce(info.ref_starts_as_actor,
                  (SELECT count(*) > 0 AND bool_and(coalesce(equal, false)) FROM first_pairs)) AS yes
  FROM info
)
SELECT s.key, s.step, s.rank, s.micro_step, s."index", s.min, s.max, s.mean,
       CASE WHEN (SELECT ref_starts_as_actor FROM info) THEN 'declared' ELSE 'detected' END AS reference_start
FROM stats AS s CROSS JOIN info CROSS JOIN applies
WHERE applies.yes AND s.canonical = 'kl' AND s.step = info.first_step AND NOT coalesce(s.absent, false)
  AND (greatest(abs(s.min), abs(s.max)) > getvariable('kl_first_step_tol') OR NOT isfinite(s.max)
       OR NOT isfinite(s.min))
ORDER BY s.rank, s.micro_step, s."index"
