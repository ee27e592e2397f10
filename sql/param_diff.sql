-- params: parameter fingerprints (kind `param`) of run A and B matched per
-- (monitor, rank, step, param); one row per parameter and step (docs/compare.md, "Parameter updates").
-- status (fingerprint_macros.sql): 'match' (the digests of the raw bytes are equal), 'close' (digests
-- differ, sum and norm agree within rtol of their scale), 'differs', 'dtype_mismatch', 'shape_mismatch', 'only_in_a',
-- 'only_in_b'. param_tolerance: dtype -> rtol (comparison/params.py: the comparison's tolerance of that
-- dtype, 0 = bitwise; where the runs' layouts differ, so that reductions ran in another order, at least
-- the layout tolerance). Macros: fingerprint_macros.sql.
SELECT
    coalesce(a.monitor, b.monitor)                       AS monitor,
    coalesce(a.rank, b.rank)                             AS rank,
    coalesce(a.step, b.step)                             AS step,
    coalesce(a.param, b.param)                           AS param,
    coalesce(a.position, b.position)                     AS position,
    a.probe_step                                         AS probe_step_a,
    b.probe_step                                         AS probe_step_b,
    a.digest                                             AS digest_a,
    b.digest                                             AS digest_b,
    a.sum                                                AS sum_a,
    b.sum                                                AS sum_b,
    a.norm                                               AS norm_a,
    b.norm                                               AS norm_b,
    abs(a.norm - b.norm) / nullif(greatest(abs(a.norm), abs(b.norm)), 0) AS norm_rel_diff,
    fingerprint_rel_err(a.digest, b.digest, a.sum, b.sum, a.norm, b.norm, coalesce(a.numel, b.numel)) AS rel_err,
    coalesce(t.rtol, 0.0)                                AS rtol,
    fingerprint_status(a.param IS NOT NULL, b.param IS NOT NULL, a.shape, b.shape, a.dtype, b.dtype,
                       a.digest, b.digest,
                       a.sum, b.sum, a.norm, b.norm, coalesce(a.numel, b.numel), coalesce(t.rtol, 0.0)) AS status
FROM params_a AS a
FULL OUTER JOIN params_b AS b
    ON a.monitor = b.monitor AND a.rank = b.rank AND a.step = b.step AND a.param = b.param
LEFT JOIN param_tolerance AS t ON t.dtype = coalesce(a.dtype, b.dtype)
ORDER BY monitor, rank, step, position, param
