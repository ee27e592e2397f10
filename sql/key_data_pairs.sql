-- Every (key, step, rank, micro_step, index) seen in EITHER run, with both sides' statistics.
-- Parameters: $keys, $steps, $ranks (lists, NULL = all). A pair is identified by its key
-- columns; the element kernel's results join back on (file_a, file_b).
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
FROM stats_a AS a
FULL OUTER JOIN stats_b AS b
    ON  a.key = b.key AND a.step = b.step AND a.rank = b.rank
    AND a.micro_step = b.micro_step AND a."index" = b."index"
WHERE ($keys IS NULL OR list_contains($keys, coalesce(a.key, b.key)))
  AND ($steps IS NULL OR list_contains($steps, coalesce(a.step, b.step)))
  AND ($ranks IS NULL OR list_contains($ranks, coalesce(a.rank, b.rank)))
