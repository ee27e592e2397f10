-- Per step: rows compared and which keys diverged, in dataflow order.
SELECT
    step,
    count(*)                                                               AS rows,
    count(*) FILTER (WHERE status NOT IN ('match', 'stats_only_match', 'absent_in_both'))    AS diverging,
    string_agg(DISTINCT key, ', ' ORDER BY key)
        FILTER (WHERE status NOT IN ('match', 'stats_only_match', 'absent_in_both'))         AS diverged_keys,
    max(max_abs_err)                                                       AS max_abs_err,
    max(max_rel_err)                                                       AS max_rel_err
FROM key_data
GROUP BY step
ORDER BY step
