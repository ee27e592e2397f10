-- Per step and canonical key: its largest error, whether every row is bitwise equal and whether any
-- diverged beyond tolerance: the verdict's data-flow rules and amplification point
-- (rlprobe/compare/amplification.py). The error of a row is the measure its tolerance judges,
-- max|a-b| / max(|a|inf, |b|inf, the family's scale floor) (rlprobe/compare/tolerance.py), so a key
-- near zero (a KL, a mean of differences) is not made large by cancellation; statistics-only rows
-- give their norm_rel_err. Tables: key_data, key_floors (canonical_key -> scale floor); $default_floor: the floor of the others.
WITH measured AS (
    SELECT k.step, k.canonical_key, k.key, k.rank, k.micro_step, k.flow_position, k.status,
           coalesce(k.dtype_a, k.dtype_b) AS dtype,
           CASE WHEN k.max_abs_err IS NOT NULL
                THEN k.max_abs_err / greatest(abs(k.min_a), abs(k.max_a), abs(k.min_b), abs(k.max_b),
                                              coalesce(f.floor, $default_floor))
                ELSE k.norm_rel_err END AS error
    FROM key_data AS k
    LEFT JOIN key_floors AS f USING (canonical_key)
)
SELECT
    step, canonical_key,
    arg_max(key, coalesce(error, -1.0))                                             AS key,
    arg_max(rank, coalesce(error, -1.0))                                            AS rank,
    arg_max(micro_step, coalesce(error, -1.0))                                      AS micro_step,
    arg_max(dtype, coalesce(error, -1.0))                                           AS dtype,
    max(error)                                                                      AS error,
    bool_and(status IN ('match', 'stats_only_match', 'absent_in_both'))              AS bitwise,
    bool_or(status NOT IN ('match', 'close', 'stats_only_match', 'stats_only_close', 'absent_in_both'))
                                                                                    AS diverged
FROM measured
GROUP BY step, canonical_key
ORDER BY step, min(flow_position), canonical_key
