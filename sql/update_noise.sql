-- update_noise: what the gradients of each update say about the parameters whose weights differ after it
-- (docs/across-devices.md, "Rounding noise amplified by the optimizer"). One row per (monitor, rank, step)
-- of `firsts` (param_first_difference.sql's rows: each monitor's first update that differs).
-- Inputs: params (param_diff.sql), grads (grad_similarity.sql), grad_steps (grad_flags.sql).
-- A parameter's gradient at that update is
--   'near_zero'    where it is within rounding of zero: its norm in both runs at most rtol x the step's
--                  largest gradient norm, rtol the one its fingerprints were judged by (the dtype's, at
--                  least the layout tolerance where the layouts differ; 0 = bitwise: nothing is near zero);
--   'sign_flipped' where its sign maps disagree on some elements (similarity < 1) while the step's
--                  weighted sign similarity is at least $similarity_min: elements whose sign is rounding;
--   'solid'        otherwise; 'missing' where no gradient of it was compared.
-- An Adam-style optimizer normalises each element, so a near-zero or flipped element becomes a full step of
-- about lr either way; a solid gradient updated alike leaves weights within rounding.
WITH judged AS (
    SELECT
        p.monitor, p.rank, p.step, p.param, p.position, p.status, s.weighted_similarity,
        CASE
            WHEN g.param IS NULL OR g.norm_a IS NULL OR g.norm_b IS NULL THEN 'missing'
            WHEN p.rtol > 0 AND greatest(g.norm_a, g.norm_b) <= p.rtol * max(greatest(g.norm_a, g.norm_b))
                 OVER (PARTITION BY p.monitor, p.rank, p.step) THEN 'near_zero'
            WHEN p.rtol > 0 AND g.similarity < 1 AND s.weighted_similarity >= $similarity_min THEN 'sign_flipped'
            ELSE 'solid'
        END AS gradient
    FROM params AS p
    JOIN firsts AS f ON f.monitor = p.monitor AND f.rank = p.rank AND f.step = p.step
    LEFT JOIN grads AS g ON g.monitor = p.monitor AND g.rank = p.rank AND g.step = p.step AND g.param = p.param
    LEFT JOIN grad_steps AS s ON s.monitor = p.monitor AND s.rank = p.rank AND s.step = p.step
    WHERE p.status IN ('match', 'close', 'differs')
)
SELECT
    monitor, rank, step,
    count(*)                                                              AS params,
    count(*) FILTER (WHERE status = 'differs')                            AS differing,
    count(*) FILTER (WHERE status = 'differs' AND gradient = 'near_zero')    AS differing_near_zero,
    count(*) FILTER (WHERE status = 'differs' AND gradient = 'sign_flipped') AS differing_sign_flipped,
    count(*) FILTER (WHERE status = 'differs' AND gradient = 'solid')        AS differing_solid,
    count(*) FILTER (WHERE status = 'differs' AND gradient = 'missing')      AS differing_missing,
    count(*) FILTER (WHERE gradient = 'missing')                          AS gradients_missing,
    any_value(weighted_similarity)                                        AS weighted_similarity,
    arg_min(param, position) FILTER (WHERE status = 'differs')            AS first_param,
    arg_min(param, position) FILTER (WHERE status = 'differs' AND gradient = 'solid') AS first_solid_param
FROM judged
GROUP BY monitor, rank, step
ORDER BY monitor, rank, step
