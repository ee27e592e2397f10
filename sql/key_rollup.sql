-- Per key: how many rows of each kind (close: within rounding, counted as matching too), where it first
-- diverged beyond tolerance, its worst errors, and the tolerance it was judged by (rtol, atol and their
-- source from key_tolerance, the largest where the key was saved in several dtypes) with its largest
-- measured error against it (norm_rel_err: max|a-b| / max(|a|inf, |b|inf), rlprobe/comparison/tolerance.py);
-- where a control run's envelope judged some of its rows (key_data's control_envelope: it was larger than the
-- dtype tolerance), the largest envelope used and key_envelope's source as the tolerance's source.
-- Tables: key_data, key_tolerance, key_envelope.
WITH tolerance AS (
    SELECT key, max(rtol) AS rtol, max(atol) AS atol, max(tolerance_source) AS tolerance_source
    FROM key_tolerance GROUP BY key
),
per_key AS (
SELECT
    key,
    count(*)                                                               AS rows,
    count(*) FILTER (WHERE status IN ('match', 'close', 'stats_only_match', 'stats_only_close', 'absent_in_both'))
                                                                           AS matching,
    count(*) FILTER (WHERE status IN ('close', 'stats_only_close'))       AS close,
    count(*) FILTER (WHERE status NOT IN ('match', 'close', 'stats_only_match', 'stats_only_close', 'absent_in_both'))
                                                                           AS diverging,
    count(*) FILTER (WHERE status = 'only_in_a')                           AS only_in_a,
    count(*) FILTER (WHERE status = 'only_in_b')                           AS only_in_b,
    count(*) FILTER (WHERE status = 'error')                               AS errors,
    min(step) FILTER (WHERE status NOT IN ('match', 'close', 'stats_only_match', 'stats_only_close',
                                           'absent_in_both'))              AS first_divergent_step,
    max(max_abs_err)                                                       AS max_abs_err,
    max(max_rel_err)                                                       AS max_rel_err,
    max(norm_rel_err)                                                      AS max_norm_rel_err,
    min(cosine)                                                            AS min_cosine,
    max(control_envelope)                                                  AS envelope,
    min(flow_position)                                                     AS flow_position
FROM key_data
GROUP BY key
)
SELECT p.* EXCLUDE (min_cosine, flow_position, envelope), t.rtol, t.atol,
       CASE WHEN p.envelope IS NULL THEN t.tolerance_source
            ELSE (SELECT any_value(source) FROM key_envelope) END AS tolerance_source,
       p.envelope, p.min_cosine, p.flow_position
FROM per_key AS p
LEFT JOIN tolerance AS t USING (key)
ORDER BY p.flow_position, p.key
