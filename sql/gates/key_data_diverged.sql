-- Gate: any key-data row that is not a match (mismatch, shape/dtype mismatch, only in one run,
-- unreadable). Returns those rows in (step, dataflow, rank, micro_step) order.
SELECT key, step, rank, micro_step, "index", status, max_abs_err, max_rel_err, message
FROM key_data
WHERE status NOT IN ('match', 'stats_only_match', 'absent_in_both')
ORDER BY step, flow_position, key, rank, micro_step, "index"
