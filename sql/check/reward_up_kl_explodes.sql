-- Check reward_up_kl_explodes (warns): the mean reward rises above the first step's while the mean
-- |KL| (key kl: the mean |mean| over the step's tensors) grows past kl_explode_factor x the first
-- step's (at least kl_floor), the sign of reward hacking. Reads: stats.
-- param kl_explode_factor = 10.0 : how many times the first step's |KL| counts as exploding
-- param kl_floor = 0.01 : the |KL| the factor applies to when the first step's is smaller (often 0)
WITH reward AS (
  SELECT step, avg(mean) AS reward FROM stats
  WHERE canonical = 'rewards' AND NOT coalesce(absent, false) GROUP BY step
),
kl AS (
  SELECT step, avg(abs(mean)) AS kl FROM stats
  WHERE canonical = 'kl' AND NOT coalesce(absent, false) GROUP BY step
),
joined AS (SELECT reward.step, reward, kl FROM reward JOIN kl USING (step)),
first AS (SELECT arg_min(reward, step) AS reward0, arg_min(kl, step) AS kl0 FROM joined)
SELECT step, reward, reward0 AS first_step_reward, kl, kl0 AS first_step_kl
FROM joined CROSS JOIN first
WHERE reward > reward0 AND kl > getvariable('kl_explode_factor') * greatest(kl0, getvariable('kl_floor'))
ORDER BY step
