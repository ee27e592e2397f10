-- What a selection ($keys, $steps, $ranks: lists, NULL = all) finds in both runs' key data, to refuse one
-- that names a key neither run saved or matches no row (a typo would otherwise compare nothing and report
-- no divergence). Tables: stats_a, stats_b. One row: the rows of both runs, those selected, the keys both runs
-- saved (sorted), their first and last step and their ranks (sorted).
WITH saved AS (
    SELECT key, step, rank FROM stats_a
    UNION ALL
    SELECT key, step, rank FROM stats_b
)
SELECT
    count(*)                                                                   AS rows,
    count(*) FILTER (WHERE ($keys IS NULL OR list_contains($keys, key))
                       AND ($steps IS NULL OR list_contains($steps, step))
                       AND ($ranks IS NULL OR list_contains($ranks, rank)))    AS selected,
    list(DISTINCT key ORDER BY key)                                            AS keys,
    min(step)                                                                  AS first_step,
    max(step)                                                                  AS last_step,
    list(DISTINCT rank ORDER BY rank)                                          AS ranks
FROM saved
