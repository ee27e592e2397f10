-- grads: one row per (monitor, rank, step, param) seen in EITHER run.
-- Inputs: grad_a, grad_b (the `grad` stats tables), sign_results (same_count per compared pair,
-- from XOR + popcount of the packed sign bits), layout_tolerance (dtype, rtol: sample_alignment.layout_rtol);
-- `position` keeps the runs' parameter order. Parameters: $first_step_min, $max_drop, $norm_rtol, $across.
-- A parameter is flagged at its first compared step (step 0 normally) when its similarity is
-- below $first_step_min, later when it drops more than $max_drop below its previous step.
-- Without sign maps (L0, or one side without them) the row is stats_only and is flagged when
-- the digests differ or the norms differ by more than $norm_rtol (relative).
-- $across (the runs' layouts differ; grad_a and grad_b hold one rank each): rounding differs, so
-- digests and per-parameter signs are not judged (a few near-zero elements flip); a parameter is
-- flagged when its norm differs by more than its dtype's layout rtol (relative) or its max or
-- min by more than rtol x scale (the largest |max|, |min| of both); grad_flags.sql judges the
-- step's weighted similarity (docs/grads.md, "Runs with different layouts").
-- Rounding (grad_tolerance: dtype -> rtol, the comparison's tolerance of that dtype, 0 = bitwise;
-- docs/grads.md, "Rounding noise"): with rtol > 0, a parameter is not flagged by its digest or its sign
-- similarity when its gradient agrees within rounding as far as its statistics tell (norm within rtol
-- relative, max and min within rtol x scale, similarity at least 0.5: rounding flips near-zero
-- elements at random, it cannot anti-correlate the signs), or when it is within rounding of zero in
-- both runs (its norm at most rtol x the step's largest gradient norm): the signs of such elements are
-- the rounding itself.
WITH pairs AS (
    SELECT
        coalesce(a.monitor, b.monitor) AS monitor,
        coalesce(a.rank, b.rank)       AS rank,
        coalesce(a.step, b.step)       AS step,
        coalesce(a.param, b.param)     AS param,
        a.param IS NOT NULL            AS in_a,
        b.param IS NOT NULL            AS in_b,
        a.shape AS shape_a, b.shape AS shape_b,
        coalesce(a.numel, b.numel)     AS numel,
        coalesce(a.dtype, b.dtype)     AS dtype,
        a.norm AS norm_a, b.norm AS norm_b, a.max AS max_a, b.max AS max_b, a.min AS min_a, b.min AS min_b,
        a.zero_fraction AS zero_fraction_a, b.zero_fraction AS zero_fraction_b,
        CASE WHEN a.digest_algo = b.digest_algo THEN a.digest = b.digest END AS digest_equal,
        a.probe_step AS probe_step_a, b.probe_step AS probe_step_b,
        coalesce(a.position, (1::BIGINT << 40) + b.position) AS position
    FROM grad_a a
    FULL OUTER JOIN grad_b b
        ON a.monitor = b.monitor AND a.rank = b.rank AND a.step = b.step AND a.param = b.param
),
scored AS (
    SELECT
        p.*,
        CASE
            WHEN NOT p.in_b THEN 'only_in_a'
            WHEN NOT p.in_a THEN 'only_in_b'
            WHEN p.shape_a IS DISTINCT FROM p.shape_b THEN 'shape_mismatch'
            WHEN s.error IS NOT NULL THEN 'error'
            WHEN s.same_count IS NOT NULL THEN 'compared'
            ELSE 'stats_only'
        END AS status,
        s.same_count,
        CASE WHEN s.same_count IS NOT NULL AND p.numel > 0 THEN s.same_count::DOUBLE / p.numel END AS similarity,
        CASE
            WHEN p.norm_a = p.norm_b THEN 0.0
            ELSE abs(p.norm_a - p.norm_b) / greatest(abs(p.norm_a), abs(p.norm_b))
        END AS norm_rel_diff,
        abs(p.max_a - p.max_b) AS max_abs_diff,
        abs(p.min_a - p.min_b) AS min_abs_diff,
        s.error AS message,
        coalesce(t.rtol, (SELECT rtol FROM layout_tolerance WHERE dtype = 'float32')) AS layout_rtol,
        greatest(abs(p.max_a), abs(p.min_a), abs(p.max_b), abs(p.min_b)) AS scale,
        coalesce(r.rtol, 0.0) AS rtol,
        max(greatest(p.norm_a, p.norm_b)) OVER (PARTITION BY p.monitor, p.rank, p.step) AS step_norm
    FROM pairs p
    LEFT JOIN sign_results s
        ON p.monitor = s.monitor AND p.rank = s.rank AND p.step = s.step AND p.param = s.param
    LEFT JOIN layout_tolerance t ON t.dtype = p.dtype
    LEFT JOIN grad_tolerance r ON r.dtype = p.dtype
),
rounded AS (
    SELECT
        *,
        CASE
            WHEN rtol = 0 OR status NOT IN ('compared', 'stats_only') THEN NULL
            WHEN coalesce(similarity, 1.0) = 1.0 AND norm_rel_diff = 0 AND max_abs_diff = 0 AND min_abs_diff = 0
                 AND digest_equal IS NOT false THEN NULL  -- nothing to explain
            WHEN greatest(norm_a, norm_b) <= rtol * step_norm THEN 'within rounding of zero'
            WHEN norm_rel_diff <= rtol AND greatest(max_abs_diff, min_abs_diff) <= rtol * scale
                 AND coalesce(similarity >= 0.5, true) THEN 'statistics within rounding'
        END AS rounding
    FROM scored
),
history AS (
    SELECT
        *,
        last_value(similarity IGNORE NULLS) OVER (
            PARTITION BY monitor, rank, param ORDER BY step ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
        ) AS prev_similarity,
        min(step) FILTER (WHERE similarity IS NOT NULL) OVER (PARTITION BY monitor, rank, param) AS first_step
    FROM rounded
)
SELECT
    monitor, rank, step, param, status, shape_a, shape_b, numel, same_count, similarity, prev_similarity,
    CASE
        WHEN $across AND status IN ('compared', 'stats_only') AND norm_rel_diff > layout_rtol
            THEN printf('norm differs by %.3g (relative) > layout tolerance %.3g (%s)', norm_rel_diff, layout_rtol,
                        coalesce(dtype, 'float32'))
        WHEN $across AND status IN ('compared', 'stats_only')
             AND greatest(max_abs_diff, min_abs_diff) > layout_rtol * scale
            THEN printf('max/min differ by %.3g of the scale > layout tolerance %.3g (%s)',
                        greatest(max_abs_diff, min_abs_diff) / scale, layout_rtol, coalesce(dtype, 'float32'))
        WHEN $across OR rounding IS NOT NULL THEN NULL
        WHEN similarity IS NOT NULL AND step = first_step AND similarity < $first_step_min
            THEN printf('similarity %.4f < %.4f at its first step', similarity, $first_step_min)
        WHEN similarity IS NOT NULL AND prev_similarity - similarity > $max_drop
            THEN printf('similarity dropped %.4f -> %.4f (more than %.4f)', prev_similarity, similarity, $max_drop)
        WHEN status = 'stats_only' AND digest_equal = false
            THEN 'gradient digests differ'
        WHEN status = 'stats_only' AND digest_equal IS NULL AND norm_rel_diff > $norm_rtol
            THEN printf('norm differs by %.3g (relative) > %.3g', norm_rel_diff, $norm_rtol)
    END AS flag_reason,
    norm_a, norm_b, norm_rel_diff, max_a, max_b, max_abs_diff, min_a, min_b, min_abs_diff,
    zero_fraction_a, zero_fraction_b, digest_equal, probe_step_a, probe_step_b, message, rtol, rounding
FROM history
ORDER BY monitor, rank, step, position
