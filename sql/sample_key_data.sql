-- key_data for runs with different layouts (docs/compare.md, "Runs with different layouts"):
-- batch keys one row per sample (pairs from sample_pairs.sql, with the rows gathered from the
-- tensor files where both runs saved them: compared, equal_count, max_abs_err, max_rel_err,
-- scale, nan_mismatch_count, error), within the dtype's layout tolerance (table layout_tolerance: dtype,
-- rtol), since a changed layout changes rounding; keys saved without sample rows (losses, other scalars)
-- one row per (key, index, step): the step's value as the trainer aggregates its micro-batches (agg_a
-- below), within the comparison's tolerance (key_tolerance). Same columns as key_data.sql.
-- Tables: sample_pairs, stats_a, stats_b, layout_tolerance, key_tolerance, key_order. Macros: pair_macros.sql.
-- Parameters: $keys, $steps, $ranks (lists, NULL = all); $summed_a, $summed_b (lists). Keys not in key_order
-- come after its last position.
WITH per_sample AS (
    SELECT p.*, coalesce(t.rtol, 0.0) AS rtol,
           greatest(abs(min_a), abs(max_a), abs(min_b), abs(max_b)) AS row_scale
    FROM sample_pairs AS p
    LEFT JOIN layout_tolerance AS t ON t.dtype = coalesce(p.dtype_a, p.dtype_b)
),
sample_rows AS (
    SELECT key, step, coalesce(rank_a, rank_b) AS rank, coalesce(micro_step_a, micro_step_b) AS micro_step,
        "index",
        CASE
            WHEN NOT in_b THEN 'only_in_a'
            WHEN NOT in_a THEN 'only_in_b'
            WHEN shape_a IS DISTINCT FROM shape_b THEN 'shape_mismatch'
            WHEN error IS NOT NULL THEN 'error'
            WHEN dtype_a <> dtype_b THEN 'dtype_mismatch'
            WHEN hash_a = hash_b THEN CASE WHEN compared OR (file_a IS NOT NULL AND file_b IS NOT NULL)
                                           THEN 'match' ELSE 'stats_only_match' END
            WHEN compared THEN CASE WHEN nan_mismatch_count = 0 AND max_abs_err <= rtol * scale
                                    THEN 'match' ELSE 'mismatch' END
            WHEN abs(sum_a - sum_b) <= rtol * numel_a * row_scale AND abs(min_a - min_b) <= rtol * row_scale
                 AND abs(max_a - max_b) <= rtol * row_scale THEN 'stats_only_match'
            ELSE 'stats_only_mismatch'
        END AS status,
        shape_a, shape_b, dtype_a, dtype_b, coalesce(numel_a, numel_b) AS numel,
        CASE WHEN hash_a = hash_b THEN coalesce(numel_a, numel_b) ELSE equal_count END AS equal_count,
        CASE WHEN hash_a = hash_b THEN 0.0 ELSE max_abs_err END AS max_abs_err,
        CASE WHEN hash_a = hash_b THEN 0.0 ELSE max_rel_err END AS max_rel_err,
        nan_mismatch_count,
        -- the measure of key_data.sql's tolerance (the layout tolerance judged these rows)
        CASE WHEN hash_a = hash_b OR max_abs_err = 0 THEN 0.0
             ELSE max_abs_err / nullif(greatest(abs(min_a), abs(max_a), abs(min_b), abs(max_b)), 0) END
                                                   AS norm_rel_err,
        concat_ws('; ',
            format('sample {}{} (A: {}; B: {})',
                   coalesce(sample_id, format('prompt {}', printf('%016x', sample))),
                   CASE WHEN occurrence > 0 THEN format(' #{}', occurrence + 1) ELSE '' END,
                   CASE WHEN in_a THEN format('rank {} micro_step {} row {}', rank_a, micro_step_a, row_a)
                        ELSE 'missing' END,
                   CASE WHEN in_b THEN format('rank {} micro_step {} row {}', rank_b, micro_step_b, row_b)
                        ELSE 'missing' END),
            CASE WHEN in_a AND in_b AND hash_a <> hash_b AND rtol > 0
                 THEN format('layout tolerance {:.2g} x row scale', rtol) END,
            CASE WHEN in_a AND in_b AND NOT coalesce(compared, false) AND hash_a <> hash_b
                 THEN 'statistics only: compared by row sum/min/max' END,
            error) AS message,
        min_a, min_b, max_a, max_b,
        sum_a / nullif(numel_a, 0) AS mean_a, sum_b / nullif(numel_b, 0) AS mean_b,
        CAST(hash_a AS VARCHAR) AS hash_a, CAST(hash_b AS VARCHAR) AS hash_b, file_a, file_b
    FROM per_sample
),
-- keys without sample rows in a run (scalars, tensors saved without an identity)
unsampled_a AS (
    SELECT * FROM stats_a AS s WHERE NOT EXISTS (
        SELECT 1 FROM samples_a AS x WHERE x.key = s.key AND x."index" = s."index" AND x.step = s.step)
),
unsampled_b AS (
    SELECT * FROM stats_b AS s WHERE NOT EXISTS (
        SELECT 1 FROM samples_b AS x WHERE x.key = s.key AND x."index" = s."index" AND x.step = s.step)
),
-- a run's step value of a key saved without sample rows: the trainer's aggregate of its micro-batches.
-- $summed_a / $summed_b: the keys each run's manifest declares summed (Probe(summed_keys=), e.g. TRL
-- GRPO's loss, already divided by the accumulation steps): the sum over a rank's micro-batches, the mean
-- over ranks (the all-reduce averages ranks). Other keys: the numel-weighted mean over every rank and
-- micro-batch (a loss backpropagated as loss / micro_batches). magnitude: the same aggregate of each row's
-- largest |value|, the scale a rounding error of the aggregate is relative to.
per_run AS (
    SELECT 'A' AS run, coalesce(list_contains($summed_a, key), false) AS summed, * FROM unsampled_a
    UNION ALL
    SELECT 'B' AS run, coalesce(list_contains($summed_b, key), false) AS summed, * FROM unsampled_b
),
per_step AS (
    SELECT run, key, "index", step, min(rank) AS rank, count(*) AS n, any_value(dtype) AS dtype,
           CASE WHEN any_value(summed) THEN 'the sum over each rank''s micro-batches (summed_keys), the mean over ranks'
                ELSE 'the mean over every rank and micro-batch' END AS how,
           -- a summed key: divided by the ranks; any other: by every row's numel
           CASE WHEN any_value(summed) THEN count(DISTINCT rank) ELSE sum(numel) END AS divisor,
           sum(mean * numel) AS total, sum(numel * greatest(abs(min), abs(max))) AS magnitudes,
           min(min) AS min, max(max) AS max, sum(numel) AS numel, bool_and(coalesce(absent, false)) AS absent
    FROM per_run GROUP BY run, key, "index", step
),
agg AS (
    SELECT *, total / nullif(divisor, 0) AS value, magnitudes / nullif(divisor, 0) AS magnitude FROM per_step
),
agg_a AS (SELECT * FROM agg WHERE run = 'A'),
agg_b AS (SELECT * FROM agg WHERE run = 'B'),
aggregates AS (
    SELECT coalesce(a.key, b.key) AS key, coalesce(a.step, b.step) AS step, coalesce(a.rank, b.rank) AS rank,
        0 AS micro_step, coalesce(a."index", b."index") AS "index",
        a.key IS NOT NULL AS in_a, b.key IS NOT NULL AS in_b, a.n AS n_a, b.n AS n_b,
        coalesce(a.how, b.how) AS how_a, coalesce(b.how, a.how) AS how_b,
        a.dtype AS dtype_a, b.dtype AS dtype_b, a.value AS value_a, b.value AS value_b,
        a.min AS min_a, b.min AS min_b, a.max AS max_a, b.max AS max_b, coalesce(a.numel, b.numel) AS numel,
        coalesce(a.absent, false) AS absent_a, coalesce(b.absent, false) AS absent_b,
        coalesce(t.stats_rtol, 0.0) AS rtol, coalesce(t.stats_atol, 0.0) AS atol, t.tolerance_source,
        greatest(a.magnitude, b.magnitude) AS scale
    FROM agg_a AS a
    FULL OUTER JOIN agg_b AS b ON a.key = b.key AND a."index" = b."index" AND a.step = b.step
    LEFT JOIN key_tolerance AS t ON t.key = coalesce(a.key, b.key) AND t.dtype = coalesce(a.dtype, b.dtype)
    WHERE ($keys IS NULL OR list_contains($keys, coalesce(a.key, b.key)))
      AND ($steps IS NULL OR list_contains($steps, coalesce(a.step, b.step)))
      AND ($ranks IS NULL OR list_contains($ranks, coalesce(a.rank, b.rank)))
),
-- judged by the comparison's tolerance of statistics-only rows (key_tolerance: tolerance.py), as key_data.sql
aggregate_status AS (
    SELECT *,
        CASE
            WHEN NOT in_b THEN 'only_in_a'
            WHEN NOT in_a THEN 'only_in_b'
            WHEN absent_a AND absent_b THEN 'absent_in_both'
            WHEN absent_a THEN 'absent_in_a'
            WHEN absent_b THEN 'absent_in_b'
            WHEN dtype_a <> dtype_b THEN 'dtype_mismatch'
            WHEN value_a = value_b THEN 'stats_only_match'
            WHEN stat_close(value_a, value_b, scale, rtol, atol) THEN 'stats_only_close'
            ELSE 'stats_only_mismatch'
        END AS status,
        abs(value_a - value_b) AS err
    FROM aggregates
),
aggregate_rows AS (
    SELECT key, step, rank, micro_step, "index", status,
        NULL::BIGINT[] AS shape_a, NULL::BIGINT[] AS shape_b, dtype_a, dtype_b, numel,
        NULL::BIGINT AS equal_count, err AS max_abs_err,
        err / nullif(greatest(abs(value_a), abs(value_b)), 0) AS max_rel_err,
        NULL::BIGINT AS nan_mismatch_count,
        CASE WHEN err = 0 THEN 0.0 ELSE err / nullif(scale, 0) END AS norm_rel_err,
        concat_ws('; ',
            CASE WHEN how_a = how_b THEN format('step value (mean_a, mean_b): {} (A: {} rows, B: {} rows)', how_a,
                                                coalesce(n_a, 0), coalesce(n_b, 0))
                 ELSE format('step value (mean_a, mean_b): A {} ({} rows), B {} ({} rows)', how_a, coalesce(n_a, 0),
                             how_b, coalesce(n_b, 0)) END,
            tolerance_text(status, dtype_a, CASE WHEN err = 0 THEN 0.0 ELSE err / nullif(scale, 0) END, rtol,
                           tolerance_source)) AS message,
        min_a, min_b, max_a, max_b, value_a AS mean_a, value_b AS mean_b,
        NULL::VARCHAR AS hash_a, NULL::VARCHAR AS hash_b, NULL::VARCHAR AS file_a, NULL::VARCHAR AS file_b
    FROM aggregate_status
),
rows AS (
    SELECT * FROM sample_rows
    UNION ALL BY NAME
    SELECT * FROM aggregate_rows
)
SELECT
    r.key, r.step, r.rank, r.micro_step, r."index", r.status, r.shape_a, r.shape_b, r.dtype_a, r.dtype_b,
    r.numel, r.equal_count,
    CASE WHEN r.equal_count IS NOT NULL THEN
        CASE WHEN r.numel = 0 THEN 100.0 ELSE 100.0 * r.equal_count / r.numel END END AS same_pct,
    NULL::BIGINT AS first_mismatch_index, r.max_abs_err, r.max_rel_err,
    NULL::DOUBLE AS within_1e3_pct, NULL::DOUBLE AS within_1e2_pct, NULL::DOUBLE AS cosine,
    r.nan_mismatch_count,
    r.norm_rel_err,
    r.message,
    r.min_a, r.min_b, r.max_a, r.max_b, r.mean_a, r.mean_b,
    NULL::DOUBLE AS norm_a, NULL::DOUBLE AS norm_b,
    NULL::BIGINT AS nan_count_a, NULL::BIGINT AS nan_count_b, NULL::BIGINT AS inf_count_a,
    NULL::BIGINT AS inf_count_b, NULL::BIGINT AS zero_count_a, NULL::BIGINT AS zero_count_b,
    r.hash_a, r.hash_b, r.file_a, r.file_b,
    coalesce(o.canonical, r.key)                   AS canonical_key,
    coalesce(o.position, (SELECT coalesce(max(position) + 1, 0) FROM key_order)) AS flow_position
FROM rows AS r
LEFT JOIN key_order AS o ON o.name = r.key
ORDER BY r.step, flow_position, r.key, r.rank, r.micro_step, r."index"
