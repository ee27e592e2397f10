-- The earliest row that is not bitwise equal (nor None in both runs), within rounding (close,
-- stats_only_close) or beyond it, in first_divergence.sql's order: summary.json's first_difference, the
-- "first difference, within rounding" of a comparison without a divergence. Empty when every row matches.
SELECT key, step, rank, micro_step, "index", status, max_abs_err, max_rel_err, norm_rel_err, rtol, atol,
       tolerance_source, message
FROM key_data
WHERE status NOT IN ('match', 'stats_only_match', 'absent_in_both')
ORDER BY step, flow_position, key, rank, micro_step, "index"
LIMIT 1
