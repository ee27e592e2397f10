-- Per key: how many rows of each kind, where it first diverged, and its worst errors.
SELECT
    key,
    count(*)                                                               AS rows,
    count(*) FILTER (WHERE status IN ('match', 'stats_only_match', 'absent_in_both'))      AS matching,
    count(*) FILTER (WHERE status NOT IN ('match', 'stats_only_match', 'absent_in_both'))  AS diverging,
    count(*) FILTER (WHERE status = 'only_in_a')                           AS only_in_a,
    count(*) FILTER (WHERE status = 'only_in_b')                           AS only_in_b,
    count(*) FILTER (WHERE status = 'error')                               AS errors,
    min(step) FILTER (WHERE status NOT IN ('match', 'stats_only_match', 'absent_in_both')) AS first_divergent_step,
    max(max_abs_err)                                                       AS max_abs_err,
    max(max_rel_err)                                                       AS max_rel_err,
    min(cosine)                                                            AS min_cosine,
    min(flow_position)                                                     AS flow_position
FROM key_data
GROUP BY key
ORDER BY flow_position, key
