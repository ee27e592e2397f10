-- The earliest row beyond tolerance: neither match, close (within rounding: rlprobe/comparison/tolerance.py),
-- stats_only_match, stats_only_close nor absent_in_both (None in both runs), in (step, dataflow order of
-- keys, rank, micro_step, index) order, with the tolerance it was judged by (key_tolerance; a row without
-- element metrics, equal_count NULL, by that of statistics-only rows). Empty when the runs agree within
-- rounding (first_difference.sql then gives the first bitwise difference). A row a control run's
-- envelope judged (control_envelope) has that envelope and key_envelope's source as its tolerance's source.
SELECT k.key, k.step, k.rank, k.micro_step, k."index", k.status, k.max_abs_err, k.max_rel_err, k.norm_rel_err,
       CASE WHEN k.equal_count IS NULL THEN t.stats_rtol ELSE t.rtol END AS rtol,
       CASE WHEN k.equal_count IS NULL THEN t.stats_atol ELSE t.atol END AS atol,
       CASE WHEN k.control_envelope IS NULL THEN t.tolerance_source
            ELSE (SELECT any_value(source) FROM key_envelope) END AS tolerance_source,
       k.control_envelope AS envelope, k.message
FROM key_data AS k
LEFT JOIN key_tolerance AS t ON t.key = k.key AND t.dtype = coalesce(k.dtype_a, k.dtype_b)
WHERE k.status NOT IN ('match', 'close', 'stats_only_match', 'stats_only_close', 'absent_in_both')
ORDER BY k.step, k.flow_position, k.key, k.rank, k.micro_step, k."index"
LIMIT 1
