-- Runs with different layouts: every (key, index, step, sample, occurrence) seen in EITHER run,
-- with where the sample's row sits on each side and the tensor holding it (tensor_address).
-- Tables: samples_a/b (the `sample` stats kind), stats_a/b (key data). Parameters: $keys,
-- $steps, $ranks (lists, NULL = all; a sample is selected when its row sits on a selected rank in either run:
-- with other rank counts, a rank only one run has still selects its samples, paired wherever the other run holds them).
WITH a AS (
    SELECT s.*, tensor_address(k.tensor_file, k.tensor_offset, k.tensor_length) AS tensor_file, k.shape
    FROM samples_a AS s
    LEFT JOIN stats_a AS k USING (key, "index", step, rank, micro_step)
),
b AS (
    SELECT s.*, tensor_address(k.tensor_file, k.tensor_offset, k.tensor_length) AS tensor_file, k.shape
    FROM samples_b AS s
    LEFT JOIN stats_b AS k USING (key, "index", step, rank, micro_step)
)
SELECT
    coalesce(a.key, b.key)                        AS key,
    coalesce(a."index", b."index")                AS "index",
    coalesce(a.step, b.step)                      AS step,
    coalesce(a.sample, b.sample)                  AS sample,
    coalesce(a.occurrence, b.occurrence)          AS occurrence,
    coalesce(a.sample_id, b.sample_id)            AS sample_id,
    a.key IS NOT NULL AS in_a, b.key IS NOT NULL AS in_b,
    a.rank AS rank_a, b.rank AS rank_b, a.micro_step AS micro_step_a, b.micro_step AS micro_step_b,
    a.row AS row_a, b.row AS row_b,
    a.dtype AS dtype_a, b.dtype AS dtype_b,
    a.shape[2:] AS shape_a, b.shape[2:] AS shape_b,  -- a row's shape: the tensor's without the sample dimension
    a.row_numel AS numel_a, b.row_numel AS numel_b,
    a.row_hash AS hash_a, b.row_hash AS hash_b,
    a.row_sum AS sum_a, b.row_sum AS sum_b, a.row_min AS min_a, b.row_min AS min_b,
    a.row_max AS max_a, b.row_max AS max_b,
    a.tensor_file AS file_a, b.tensor_file AS file_b
FROM a FULL OUTER JOIN b
    ON a.key = b.key AND a."index" = b."index" AND a.step = b.step AND a.sample = b.sample
   AND a.occurrence = b.occurrence
WHERE ($keys IS NULL OR list_contains($keys, coalesce(a.key, b.key)))
  AND ($steps IS NULL OR list_contains($steps, coalesce(a.step, b.step)))
  AND ($ranks IS NULL OR list_contains($ranks, a.rank) OR list_contains($ranks, b.rank))
