-- The tensor file pairs the element kernel compares: rows with a tensor file on both sides and
-- equal shapes. Tables: stats_a, stats_b (through key_data_pairs, with pair_macros.sql).
-- Parameters: $keys, $steps, $ranks (lists, NULL = all).
SELECT DISTINCT file_a, file_b
FROM key_data_pairs($keys, $steps, $ranks)
WHERE in_a AND in_b AND file_a <> '' AND file_b <> '' AND shape_a IS NOT DISTINCT FROM shape_b
ORDER BY file_a, file_b
