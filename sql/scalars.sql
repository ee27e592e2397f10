-- Both runs' per-step scalars (from log_metrics) side by side: one row per (step, name, rank).
-- Inputs: scalars_a, scalars_b (step, name, value, wall_time, rank). A name logged twice in one
-- step is averaged. rel_change = (value_b - value_a) / |value_a| (0 when both are 0, NULL when
-- only A is 0 or a side is missing).
WITH a AS (SELECT step, name, rank, avg(value) AS value FROM scalars_a GROUP BY step, name, rank),
     b AS (SELECT step, name, rank, avg(value) AS value FROM scalars_b GROUP BY step, name, rank)
SELECT
    coalesce(a.step, b.step) AS step,
    coalesce(a.name, b.name) AS name,
    coalesce(a.rank, b.rank) AS rank,
    a.value                  AS value_a,
    b.value                  AS value_b,
    CASE
        WHEN a.value IS NULL OR b.value IS NULL THEN NULL
        WHEN a.value = 0 THEN CASE WHEN b.value = 0 THEN 0.0 ELSE NULL END
        ELSE (b.value - a.value) / abs(a.value)
    END                      AS rel_change
FROM a
FULL OUTER JOIN b ON a.step = b.step AND a.name = b.name AND a.rank = b.rank
ORDER BY name, step, rank
