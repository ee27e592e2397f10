-- Every module tensor (stage, step, rank, module, call, direction, io, index) seen in EITHER
-- run, with both sides' execution order (seq) and statistics (stat_sides, pair_macros.sql).
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
    false                                             AS absent_a,   -- module tensors are never None
    false                                             AS absent_b,
    unnest(stat_sides(a, b))
FROM module_a AS a
FULL OUTER JOIN module_b AS b
    ON  a.stage = b.stage AND a.step = b.step AND a.rank = b.rank AND a.module = b.module
    AND a.call = b.call AND a.direction = b.direction AND a.io = b.io AND a."index" = b."index"
WHERE ($stages IS NULL OR list_contains($stages, coalesce(a.stage, b.stage)))
  AND ($steps IS NULL OR list_contains($steps, coalesce(a.step, b.step)))
  AND ($ranks IS NULL OR list_contains($ranks, coalesce(a.rank, b.rank)))
