-- At one step ($step): per canonical key, whether any of its rows diverged. Used for the verdict.
SELECT
    canonical_key,
    bool_or(status NOT IN ('match', 'close', 'stats_only_match', 'stats_only_close', 'absent_in_both'))  AS diverged,
    bool_and(status IN ('only_in_a', 'only_in_b'))         AS one_sided
FROM key_data
WHERE step = $step
GROUP BY canonical_key
