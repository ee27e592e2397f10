-- Check grad_norm_spike (fails): a gradient monitor's total norm (over its parameters) at a step is
-- not more than grad_spike_factor x the median of the same monitor's and rank's previous 5 steps,
-- and is finite. Needs a gradient monitor (probe.monitor_grads) with at least two steps.
-- Reads: grad_steps (monitor, step, rank, norm, nonfinite_params).
-- param grad_spike_factor = 10.0 : how many times the recent median norm counts as a spike
WITH windowed AS (
  SELECT monitor, step, rank, norm, nonfinite_params,
         median(norm) OVER (PARTITION BY monitor, rank ORDER BY step ROWS BETWEEN 5 PRECEDING AND 1 PRECEDING)
           AS recent_median
  FROM grad_steps
)
SELECT monitor, step, rank, norm, recent_median, norm / nullif(recent_median, 0) AS times_median, nonfinite_params
FROM windowed
WHERE nonfinite_params > 0 OR NOT isfinite(norm)
   OR (recent_median IS NOT NULL AND norm > getvariable('grad_spike_factor') * recent_median)
ORDER BY step, monitor, rank
