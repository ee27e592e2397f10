-- Check kl_first_step (fails): at the run's first step, when the reference model starts as the actor,
-- the KL between them (key kl; verl/OpenRLHF kl_penalty) is 0. That the reference starts as the actor
-- is declared by a config leaf `ref_starts_as_actor: true` (or `--param ref_starts_as_actor=true`),
-- or, without a declaration, detected from the first step's saved log-probs: ref_log_prob equals
-- old_log_prob (else log_prob) bitwise (equal hashes; equal min/max/mean where no hash is saved) in
-- every batch of the first step. One row per kl tensor of the first step whose largest |value|
-- exceeds its tolerance: the larger of kl_first_step_tol and the rounding of the log-probs the KL is
-- computed from, kl_first_step_ulps x the machine epsilon of the finer dtype of that batch's (same rank,
-- micro-step, index) ref_log_prob and old_log_prob/log_prob (those of the rank's first step for a batch
-- that saved none, the kl's own dtype where no rank did; float64 2.2e-16, float32 1.19e-7, float16 9.8e-4,
-- bfloat16 7.8e-3) x max(1, their largest finite |value|): a reference forward of another batch shape
-- rounds its log-probs a few ulps apart from the actor's (float32 at |log-prob| 8-16: 9.5e-7 an ulp), a
-- reference in a coarser dtype than the actor is beyond it (docs/check.md, "Agreement is rounding").
-- Reads: stats, run_info (ref_starts_as_actor, first_step).
-- param kl_first_step_tol = 1e-06 : the largest |KL| allowed at the first step, whatever the rounding
-- param kl_first_step_ulps = 16 : how many machine epsilons (of the log-probs' magnitude) the first step's KL may reach
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
),
rounding AS (  -- each first-step tensor's machine epsilon and largest finite |value|
  SELECT *, CASE WHEN lower(dtype) LIKE '%bfloat16%' THEN 0.0078125
                 WHEN lower(dtype) LIKE '%float16%' THEN 0.0009765625
                 WHEN lower(dtype) LIKE '%float64%' THEN 2.220446049250313e-16
                 ELSE 1.1920928955078125e-07 END AS ulp,
         greatest(CASE WHEN isfinite(min) THEN abs(min) ELSE 0 END,
                  CASE WHEN isfinite(max) THEN abs(max) ELSE 0 END) AS magnitude
  FROM first_step
),
batch_inputs AS (  -- the log-probs of each batch: the finest epsilon, the largest |value|
  SELECT rank, micro_step, "index", min(ulp) AS ulp, max(magnitude) AS magnitude
  FROM rounding WHERE canonical IN ('ref_log_prob', 'old_log_prob', 'log_prob')
  GROUP BY rank, micro_step, "index"
),
rank_inputs AS (  -- those of the rank's first step, for a batch that saved none
  SELECT rank, min(ulp) AS ulp, max(magnitude) AS magnitude
  FROM rounding WHERE canonical IN ('ref_log_prob', 'old_log_prob', 'log_prob')
  GROUP BY rank
),
kl AS (
  SELECT s.*,
         greatest(getvariable('kl_first_step_tol'),
                  getvariable('kl_first_step_ulps') * greatest(1.0, coalesce(b.magnitude, r.magnitude, 0))
                  * coalesce(b.ulp, r.ulp, s.ulp)) AS tolerance
  FROM rounding AS s
  LEFT JOIN batch_inputs AS b ON b.rank = s.rank AND b.micro_step = s.micro_step AND b."index" = s."index"
  LEFT JOIN rank_inputs AS r ON r.rank = s.rank
  WHERE s.canonical = 'kl'
)
SELECT s.key, s.step, s.rank, s.micro_step, s."index", s.min, s.max, s.mean, s.tolerance,
       CASE WHEN (SELECT ref_starts_as_actor FROM info) THEN 'declared' ELSE 'detected' END AS reference_start
FROM kl AS s CROSS JOIN applies
WHERE applies.yes AND (greatest(abs(s.min), abs(s.max)) > s.tolerance OR NOT isfinite(s.max) OR NOT isfinite(s.min))
ORDER BY s.rank, s.micro_step, s."index"
