-- Gate: any key-data row beyond tolerance (mismatch, shape/dtype mismatch, only in one run, unreadable);
-- close rows (within rounding: rlprobe/comparison/tolerance.py) agree, unless bitwise asks for bitwise
-- equality, when they are violations too. Returns those rows in (step, dataflow, rank, micro_step) order.
-- param bitwise = false : true counts a close or stats_only_close row (within rounding) as a violation
SELECT key, step, rank, micro_step, "index", status, max_abs_err, max_rel_err, message
FROM key_data
WHERE status NOT IN ('match', 'stats_only_match', 'absent_in_both')
  AND (getvariable('bitwise') OR status NOT IN ('close', 'stats_only_close'))
ORDER BY step, flow_position, key, rank, micro_step, "index"
