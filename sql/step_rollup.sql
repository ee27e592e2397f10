-- Per step: rows compared and which keys diverged, in dataflow order.
SELECT
    step,
    count(*)                                                               AS rows,
    count(*) FILTER (WHERE status IN ('close', 'stats_only_close'))       AS close,
    count(*) FILTER (WHERE status NOT IN ('match', 'close', 'stats_only_match', 'stats_only_close', 'absent_in_both'))    AS diverging,
    string_agg(DISTINCT key, ', ' ORDER BY key)
        FILTER (WHERE status NOT IN ('match', 'close', 'stats_only_match', 'stats_only_close', 'absent_in_both'))         AS diverged_keys,
    max(max_abs_err)                                                       AS max_abs_err,
    max(max_rel_err)                                                       AS max_rel_err
FROM key_data
GROUP BY step
ORDER BY step
