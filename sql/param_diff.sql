-- params: parameter fingerprints (kind `param`) of run A and B matched per
-- (monitor, rank, step, param); one row per parameter and step (docs/compare.md, "Parameter updates").
-- status: 'match' (the digests of the raw bytes are equal), 'close' (digests differ, but $exact is
-- false (the runs' layouts differ, so reductions ran in another order) and sum and norm agree
-- within $rtol of their scale), 'differs', 'shape_mismatch', 'only_in_a', 'only_in_b'.
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
    CASE
        WHEN a.param IS NULL THEN 'only_in_b'
        WHEN b.param IS NULL THEN 'only_in_a'
        WHEN a.shape IS DISTINCT FROM b.shape THEN 'shape_mismatch'
        WHEN a.digest = b.digest THEN 'match'
        WHEN NOT $exact
             AND abs(a.norm - b.norm) <= $rtol * greatest(abs(a.norm), abs(b.norm))
             AND abs(a.sum - b.sum) <= $rtol * greatest(a.norm * sqrt(a.numel), 1e-30) THEN 'close'
        ELSE 'differs'
    END                                                  AS status
FROM params_a AS a
FULL OUTER JOIN params_b AS b
    ON a.monitor = b.monitor AND a.rank = b.rank AND a.step = b.step AND a.param = b.param
ORDER BY monitor, rank, step, position, param
