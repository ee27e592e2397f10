-- One line per key for `rlprobe info`: what was captured, where, and how much.
SELECT
    key,
    string_agg(DISTINCT coalesce(dtype, '?'), ', ' ORDER BY coalesce(dtype, '?')) AS dtypes,
    count(DISTINCT step)        AS steps,
    min(step)                   AS first_step,
    max(step)                   AS last_step,
    count(DISTINCT rank)        AS ranks,
    max(micro_step) + 1         AS micro_steps,
    count(DISTINCT index)       AS indexes,
    count(*)                    AS tensors,
    sum(numel)                  AS elements,
    count(tensor_file)          AS tensor_files
FROM key_data
GROUP BY key
ORDER BY key
