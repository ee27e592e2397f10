-- Gate: loss drift. Returns every (step, rank) where run B's getvariable('loss_metric')
-- (default 'loss') differs from run A's by more than getvariable('loss_max_rel_drift')
-- (default 0.01, relative to |A|), or is NaN on one side only, or is logged by one run only.
-- Change the defaults in the pipeline: params: {loss_metric: loss, loss_max_rel_drift: 0.01}.
-- param loss_metric = "loss" : the loss metric compared
-- param loss_max_rel_drift = 0.01 : the largest |B - A| relative to |A|
SELECT step, rank, name, value_a, value_b, rel_change
FROM scalars
WHERE name = getvariable('loss_metric')
  AND (
        value_a IS NULL OR value_b IS NULL
     OR isnan(value_a) <> isnan(value_b)
     OR abs(value_b - value_a) > getvariable('loss_max_rel_drift') * abs(value_a)
  )
ORDER BY step, rank
