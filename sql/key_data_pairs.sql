-- key_data_pairs(keys, steps, ranks): every (key, step, rank, micro_step, index) seen in EITHER
-- run, with both sides' statistics (stat_sides, pair_macros.sql). Tables: stats_a, stats_b.
-- Arguments: lists, NULL = all. A pair is identified by its key columns; the element kernel's
-- results join back on (file_a, file_b): the tensors' addresses (tensor_address, pair_macros.sql).
CREATE OR REPLACE TEMP MACRO key_data_pairs(keys, steps, ranks) AS TABLE
SELECT
    coalesce(a.key, b.key)                            AS key,
    coalesce(a.step, b.step)                          AS step,
    coalesce(a.rank, b.rank)                          AS rank,
    coalesce(a.micro_step, b.micro_step)              AS micro_step,
    coalesce(a."index", b."index")                    AS "index",
    a.key IS NOT NULL                                 AS in_a,
    b.key IS NOT NULL                                 AS in_b,
    coalesce(a.absent, false)                         AS absent_a,   -- saved as None: no tensor, no statistics
    coalesce(b.absent, false)                         AS absent_b,
    unnest(stat_sides(a, b))
FROM (SELECT * REPLACE (tensor_address(tensor_file, tensor_offset, tensor_length) AS tensor_file) FROM stats_a) AS a
FULL OUTER JOIN
     (SELECT * REPLACE (tensor_address(tensor_file, tensor_offset, tensor_length) AS tensor_file) FROM stats_b) AS b
    ON  a.key = b.key AND a.step = b.step AND a.rank = b.rank
    AND a.micro_step = b.micro_step AND a."index" = b."index"
WHERE (keys IS NULL OR list_contains(keys, coalesce(a.key, b.key)))
  AND (steps IS NULL OR list_contains(steps, coalesce(a.step, b.step)))
  AND (ranks IS NULL OR list_contains(ranks, coalesce(a.rank, b.rank)));
