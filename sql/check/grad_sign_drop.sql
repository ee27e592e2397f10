-- Check grad_sign_drop (fails): the share of gradient elements whose sign equals the previous
-- step's (weighted by numel, from the gradient monitor's sign maps, levels L1/L2) does not fall by
-- more than max_sign_agreement_drop from one step to the next. Reads: grad_steps.
-- param max_sign_agreement_drop = 0.25 : the largest fall of sign agreement between consecutive steps
WITH ordered AS (
  SELECT monitor, step, rank, sign_agreement,
         lag(sign_agreement) OVER (PARTITION BY monitor, rank ORDER BY step) AS previous_agreement
  FROM grad_steps
  WHERE sign_agreement IS NOT NULL
)
SELECT monitor, step, rank, sign_agreement, previous_agreement, previous_agreement - sign_agreement AS drop
FROM ordered
WHERE previous_agreement - sign_agreement > getvariable('max_sign_agreement_drop')
ORDER BY step, monitor, rank
