-- One line per key for `rlprobe info`: what was captured, where, and how much.
-- `absent` counts the rows saved as None (not computed): no dtype ("None" among the dtypes), no tensor.
SELECT
    key,
    string_agg(DISTINCT CASE WHEN absent THEN 'None' ELSE coalesce(dtype, '?') END, ', '
               ORDER BY CASE WHEN absent THEN 'None' ELSE coalesce(dtype, '?') END) AS dtypes,
    count(DISTINCT step)                                      AS steps,
    min(step)                                                 AS first_step,
    max(step)                                                 AS last_step,
    count(DISTINCT rank)                                      AS ranks,
    max(micro_step) + 1                                       AS micro_steps,
    count(DISTINCT index)                                     AS indexes,
    count(*) FILTER (WHERE NOT coalesce(absent, false))       AS tensors,
    count(*) FILTER (WHERE absent)                            AS absent,
    sum(numel)                                                AS elements,
    count(tensor_file)                                        AS tensor_files
FROM key_data
GROUP BY key
ORDER BY key
