-- The earliest row that is neither match, stats_only_match nor absent_in_both (None in both runs), in (step, dataflow order of
-- keys, rank, micro_step, index) order. Empty when the runs agree.
SELECT key, step, rank, micro_step, "index", status, max_abs_err, max_rel_err, message
FROM key_data
WHERE status NOT IN ('match', 'stats_only_match', 'absent_in_both')
ORDER BY step, flow_position, key, rank, micro_step, "index"
LIMIT 1
