-- Every module tensor (stage, step, rank, module, call, direction, io, index) seen in EITHER
-- run, with both sides' execution order (seq) and statistics.
-- Tables: module_a, module_b (the `module` stats of runs A and B).
-- Parameters: $stages, $steps, $ranks (lists, NULL = all).
SELECT
    row_number() OVER () - 1                          AS pair_id,
    coalesce(a.stage, b.stage)                        AS stage,
    coalesce(a.step, b.step)                          AS step,
    coalesce(a.rank, b.rank)                          AS rank,
    coalesce(a.module, b.module)                      AS module,
    coalesce(a.call, b.call)                          AS call,
    coalesce(a.direction, b.direction)                AS direction,
    coalesce(a.io, b.io)                              AS io,
    coalesce(a."index", b."index")                    AS "index",
    a.seq AS seq_a, b.seq AS seq_b,
    a.stage IS NOT NULL                               AS in_a,
    b.stage IS NOT NULL                               AS in_b,
    a.shape AS shape_a, b.shape AS shape_b,
    a.dtype AS dtype_a, b.dtype AS dtype_b,
    a.numel AS numel_a, b.numel AS numel_b,
    a.tensor_file AS file_a, b.tensor_file AS file_b,
    a.min AS min_a, b.min AS min_b, a.max AS max_a, b.max AS max_b,
    a.mean AS mean_a, b.mean AS mean_b, a.norm AS norm_a, b.norm AS norm_b,
    a.nan_count AS nan_count_a, b.nan_count AS nan_count_b,
    a.inf_count AS inf_count_a, b.inf_count AS inf_count_b,
    a.zero_count AS zero_count_a, b.zero_count AS zero_count_b,
    a.hash AS hash_a, b.hash AS hash_b
FROM module_a AS a
FULL OUTER JOIN module_b AS b
    ON  a.stage = b.stage AND a.step = b.step AND a.rank = b.rank AND a.module = b.module
    AND a.call = b.call AND a.direction = b.direction AND a.io = b.io AND a."index" = b."index"
WHERE ($stages IS NULL OR list_contains($stages, coalesce(a.stage, b.stage)))
  AND ($steps IS NULL OR list_contains($steps, coalesce(a.step, b.step)))
  AND ($ranks IS NULL OR list_contains($ranks, coalesce(a.rank, b.rank)))
