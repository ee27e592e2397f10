-- The errors the verdict's amplification point and error jump read (rlprobe/comparison/amplification.py):
-- per step (canonical_key NULL) its largest error over the float keys, and per (step, canonical key) for
-- the steps in $steps only, each with the key, rank, micro_step and dtype of its largest error, whether
-- every row is bitwise equal and whether any diverged beyond tolerance.
-- The error of a row is the measure its tolerance judges, max|a-b| / max(|a|inf, |b|inf, the family's
-- scale floor) (rlprobe/comparison/tolerance.py), so a key near zero (a KL, a mean of differences) is not made
-- large by cancellation; statistics-only rows give their norm_rel_err; NULL for keys that are not rated
-- (dtypes outside $float_dtypes, canonical keys in $exact_keys: tokens part, they do not drift).
-- Tables: key_data, key_floors (canonical_key -> scale floor); $default_floor: the floor of the others.
WITH measured AS (
    SELECT k.step, k.canonical_key, k.key, k.rank, k.micro_step, k.flow_position,
           coalesce(k.dtype_a, k.dtype_b) AS dtype,
           k.status IN ('match', 'stats_only_match', 'absent_in_both') AS bitwise,
           k.status NOT IN ('match', 'close', 'stats_only_match', 'stats_only_close', 'absent_in_both') AS diverged,
           CASE WHEN NOT list_contains($float_dtypes, coalesce(k.dtype_a, k.dtype_b))
                     OR list_contains($exact_keys, k.canonical_key) THEN NULL
                WHEN k.max_abs_err IS NOT NULL
                THEN k.max_abs_err / greatest(abs(k.min_a), abs(k.max_a), abs(k.min_b), abs(k.max_b),
                                              coalesce(f.floor, $default_floor))
                ELSE k.norm_rel_err END AS error
    FROM key_data AS k
    LEFT JOIN key_floors AS f USING (canonical_key)
)
SELECT * FROM (  -- a union's ORDER BY takes expressions only from a FROM clause (DuckDB 1.4)
    SELECT step, NULL AS canonical_key, arg_max(key, coalesce(error, -1.0)) AS key, NULL AS rank, NULL AS micro_step,
           arg_max(dtype, coalesce(error, -1.0)) AS dtype, max(error) AS error, bool_and(bitwise) AS bitwise,
           bool_or(diverged) AS diverged, NULL AS flow_position
    FROM measured
    GROUP BY step
    UNION ALL
    SELECT step, canonical_key, arg_max(key, coalesce(error, -1.0)), arg_max(rank, coalesce(error, -1.0)),
           arg_max(micro_step, coalesce(error, -1.0)), arg_max(dtype, coalesce(error, -1.0)), max(error),
           bool_and(bitwise), bool_or(diverged), min(flow_position)
    FROM measured
    WHERE list_contains($steps, step)
    GROUP BY step, canonical_key
)
ORDER BY step, canonical_key IS NOT NULL, flow_position, canonical_key
