-- The first parameter update that differs, per monitor: the earliest optimizer step (on any rank)
-- where a parameter's fingerprint is 'differs', 'shape_mismatch' or 'dtype_mismatch' in `params` (param_diff.sql),
-- and at that step the first such parameter in the model's order. One row per monitor, earliest first.
WITH differing AS (
    SELECT *, row_number() OVER (PARTITION BY monitor ORDER BY step, position, rank, param) AS nth
    FROM params
    WHERE status IN ('differs', 'shape_mismatch', 'dtype_mismatch')
),
matched_before AS (
    SELECT d.monitor, count(p.param) AS matched_rows
    FROM differing AS d
    LEFT JOIN params AS p ON p.monitor = d.monitor AND p.step < d.step AND p.status IN ('match', 'close')
    WHERE d.nth = 1
    GROUP BY d.monitor
)
SELECT d.monitor, d.rank, d.step, coalesce(d.probe_step_a, d.probe_step_b) AS probe_step, d.param, d.position,
       d.status, d.norm_a, d.norm_b, d.norm_rel_diff, m.matched_rows
FROM differing AS d
JOIN matched_before AS m USING (monitor)
WHERE d.nth = 1
ORDER BY probe_step, d.step, d.monitor
