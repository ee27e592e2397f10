-- The earliest row beyond tolerance: neither match, close (within rounding: rlprobe/compare/tolerance.py),
-- stats_only_match, stats_only_close nor absent_in_both (None in both runs), in (step, dataflow order of
-- keys, rank, micro_step, index) order. Empty when the runs agree within rounding (first_difference.sql
-- then gives the first bitwise difference).
SELECT key, step, rank, micro_step, "index", status, max_abs_err, max_rel_err, norm_rel_err, rtol, atol, message
FROM key_data
WHERE status NOT IN ('match', 'close', 'stats_only_match', 'stats_only_close', 'absent_in_both')
ORDER BY step, flow_position, key, rank, micro_step, "index"
LIMIT 1
