-- grad_steps: one row per (monitor, rank, step) from `grads` (grad_similarity.sql + flagged).
-- weighted_similarity is the element-weighted mean over the compared parameters
-- (sum of agreeing bits / sum of elements), without the gradients within rounding of zero
-- (grad_similarity.sql's `rounding`: their signs are the rounding itself). The weighted series is flagged by the same rule
-- as a parameter ($first_step_min at its first step, a drop above $max_drop later); a step is
-- flagged when it or any of its parameters is, and `reason` names them. Unmatched parameters
-- (only in one run, other shape) are named in `reason` without flagging the step.
WITH steps AS (
    SELECT
        monitor, rank, step,
        count(*) FILTER (WHERE status = 'compared')                         AS params_compared,
        sum(numel) FILTER (WHERE status = 'compared' AND NOT zero)::BIGINT  AS numel,
        sum(same_count) FILTER (WHERE status = 'compared' AND NOT zero)::BIGINT AS same_count,
        count(*) FILTER (WHERE status NOT IN ('compared', 'stats_only'))    AS unmatched_params,
        string_agg(status || ' ' || param, ', ' ORDER BY param)
            FILTER (WHERE status NOT IN ('compared', 'stats_only'))         AS unmatched,
        count(*) FILTER (WHERE flagged)                                     AS flagged_params,
        string_agg(param, ', ' ORDER BY similarity NULLS LAST, param) FILTER (WHERE flagged) AS flagged_names,
        max(norm_rel_diff)                                                  AS max_norm_rel_diff
    FROM (SELECT *, coalesce(rounding = 'within rounding of zero', false) AS zero FROM grads)
    GROUP BY monitor, rank, step
),
weighted AS (
    SELECT *, CASE WHEN numel > 0 THEN same_count::DOUBLE / numel END AS weighted_similarity
    FROM steps
),
history AS (
    SELECT
        *,
        last_value(weighted_similarity IGNORE NULLS) OVER (
            PARTITION BY monitor, rank ORDER BY step ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
        ) AS prev_weighted_similarity,
        min(step) FILTER (WHERE weighted_similarity IS NOT NULL) OVER (PARTITION BY monitor, rank) AS first_step
    FROM weighted
),
judged AS (
    SELECT
        *,
        CASE
            WHEN weighted_similarity IS NOT NULL AND step = first_step AND weighted_similarity < $first_step_min
                THEN printf('weighted similarity %.4f < %.4f at the first step', weighted_similarity, $first_step_min)
            WHEN weighted_similarity IS NOT NULL AND prev_weighted_similarity - weighted_similarity > $max_drop
                THEN printf('weighted similarity dropped %.4f -> %.4f', prev_weighted_similarity, weighted_similarity)
        END AS weighted_reason
    FROM history
)
SELECT
    monitor, rank, step, params_compared, numel, same_count, weighted_similarity, prev_weighted_similarity,
    weighted_reason IS NOT NULL OR flagged_params > 0 AS flagged,
    nullif(concat_ws('; ',
        weighted_reason,
        CASE WHEN flagged_params > 0 THEN printf('%d flagged: %s', flagged_params, flagged_names) END,
        CASE WHEN unmatched_params > 0 THEN printf('%d unmatched: %s', unmatched_params, unmatched) END
    ), '') AS reason,
    flagged_params, unmatched_params, max_norm_rel_diff
FROM judged
ORDER BY monitor, rank, step
