-- Gate: throughput regression. Returns one row when run B's mean of the metric
-- getvariable('tps_metric') (default 'e2e_tps') over all steps and ranks is more than
-- getvariable('tps_max_drop') (default 0.05, i.e. 5%) below run A's; no rows otherwise.
-- Change the defaults in the pipeline: params: {tps_metric: e2e_tps, tps_max_drop: 0.05}.
-- param tps_metric = "e2e_tps" : the throughput metric compared
-- param tps_max_drop = 0.05 : the largest drop of its mean in run B (0.05: 5%)
SELECT
    name,
    count(*)                             AS steps_compared,
    avg(value_a)                         AS mean_a,
    avg(value_b)                         AS mean_b,
    avg(value_b) / avg(value_a) - 1      AS change,
    -getvariable('tps_max_drop')         AS allowed_change
FROM scalars
WHERE name = getvariable('tps_metric')
  AND value_a IS NOT NULL AND value_b IS NOT NULL
GROUP BY name
HAVING avg(value_b) < avg(value_a) * (1 - getvariable('tps_max_drop'))
