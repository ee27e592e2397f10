-- The first weights that differ at a module dump, per (stage, step, rank): the first parameter, in the
-- model's order, whose fingerprint is 'differs', 'shape_mismatch' or 'dtype_mismatch' in `module_weights`
-- (module_weights.sql) in the stage's earliest block that has one. Rows only in one run are not a
-- difference of the weights (the runs entered the stage a different number of times: another
-- micro-batch layout). Earliest step first. Table: module_weights.
SELECT stage, step, rank, block, module, call, param, parameter, position, status, rel_err, rtol, dtype, dtype_a, dtype_b, norm_a, norm_b
FROM module_weights
WHERE status IN ('differs', 'shape_mismatch', 'dtype_mismatch')
QUALIFY row_number() OVER (PARTITION BY stage, step, rank ORDER BY block, position) = 1
ORDER BY step, rank, stage
