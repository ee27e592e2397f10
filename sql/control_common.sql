-- Whether control run C has key data in common with run A (rlprobe/comparison/control_run.py): the rows of
-- A-vs-C's key_data that both saved and that were compared (same shape and dtype: an error to measure), and
-- each run's keys (named by the error where there are none).
-- Tables: key_data, stats_a (run A), stats_b (run C).
SELECT (SELECT count(*) FROM key_data
        WHERE step >= 0 AND status IN ('match', 'close', 'mismatch', 'stats_only_match', 'stats_only_close',
                                       'stats_only_mismatch'))                                  AS rows,
       (SELECT string_agg(DISTINCT key, ', ' ORDER BY key) FROM stats_a)                            AS keys_a,
       (SELECT string_agg(DISTINCT key, ', ' ORDER BY key) FROM stats_b)                            AS keys_c
