-- module_weights: the weights at each module dump (kind `module_param`: each hooked module's own
-- parameters as a stage block started) of run A and B, matched per (stage, step, rank, block, module,
-- param); docs/modules.md, "Weights at the call". status (fingerprint_macros.sql): match, close,
-- differs, shape_mismatch, dtype_mismatch, only_in_a, only_in_b; rtol from module_weight_tolerance (dtype -> rtol: the
-- comparison's tolerance of that dtype, 0 = bitwise). Tables: module_weights_a, module_weights_b.
SELECT
    coalesce(a.stage, b.stage)                           AS stage,
    coalesce(a.step, b.step)                             AS step,
    coalesce(a.rank, b.rank)                             AS rank,
    coalesce(a.block, b.block)                           AS block,
    coalesce(a.module, b.module)                         AS module,
    coalesce(a.call, b.call)                             AS call,
    coalesce(a.param, b.param)                           AS param,
    CASE WHEN coalesce(a.module, b.module) = '' THEN coalesce(a.param, b.param)
         ELSE coalesce(a.module, b.module) || '.' || coalesce(a.param, b.param) END AS parameter,
    coalesce(a.position, b.position)                     AS position,
    fingerprint_status(a.param IS NOT NULL, b.param IS NOT NULL, a.shape, b.shape, a.dtype, b.dtype,
                       a.digest, b.digest,
                       a.sum, b.sum, a.norm, b.norm, coalesce(a.numel, b.numel), coalesce(t.rtol, 0.0)) AS status,
    fingerprint_rel_err(a.digest, b.digest, a.sum, b.sum, a.norm, b.norm, coalesce(a.numel, b.numel)) AS rel_err,
    coalesce(t.rtol, 0.0)                                AS rtol,
    coalesce(a.dtype, b.dtype)                           AS dtype,
    a.dtype AS dtype_a, b.dtype AS dtype_b,
    a.shape AS shape_a, b.shape AS shape_b,
    a.digest AS digest_a, b.digest AS digest_b, a.sum AS sum_a, b.sum AS sum_b, a.norm AS norm_a, b.norm AS norm_b
FROM module_weights_a AS a
FULL OUTER JOIN module_weights_b AS b
    ON a.stage = b.stage AND a.step = b.step AND a.rank = b.rank AND a.block = b.block AND a.module = b.module
       AND a.param = b.param
LEFT JOIN module_weight_tolerance AS t ON t.dtype = coalesce(a.dtype, b.dtype)
ORDER BY step, stage, rank, block, position
