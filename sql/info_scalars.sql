-- One line per scalar name for `rlprobe info`.
SELECT
    name,
    count(DISTINCT step) AS steps,
    min(step)            AS first_step,
    max(step)            AS last_step,
    count(DISTINCT rank) AS ranks,
    avg(value)           AS mean_value
FROM scalars
GROUP BY name
ORDER BY name
