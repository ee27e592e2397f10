-- The earliest row that is not bitwise equal (nor None in both runs), within rounding (close,
-- stats_only_close) or beyond it, in first_divergence.sql's order and with its columns: summary.json's
-- first_difference, the "first difference, within rounding" of a comparison without a divergence. Empty
-- when every row matches; a row a control run's envelope judged has it (key_envelope's source).
-- Tables: key_data, key_tolerance, key_envelope.
SELECT k.key, k.step, k.rank, k.micro_step, k."index", k.status, k.max_abs_err, k.max_rel_err, k.norm_rel_err,
       CASE WHEN k.equal_count IS NULL THEN t.stats_rtol ELSE t.rtol END AS rtol,
       CASE WHEN k.equal_count IS NULL THEN t.stats_atol ELSE t.atol END AS atol,
       CASE WHEN k.control_envelope IS NULL THEN t.tolerance_source
            ELSE (SELECT any_value(source) FROM key_envelope) END AS tolerance_source,
       k.control_envelope AS envelope, k.message
FROM key_data AS k
LEFT JOIN key_tolerance AS t ON t.key = k.key AND t.dtype = coalesce(k.dtype_a, k.dtype_b)
WHERE k.status NOT IN ('match', 'stats_only_match', 'absent_in_both')
ORDER BY k.step, k.flow_position, k.key, k.rank, k.micro_step, k."index"
LIMIT 1
