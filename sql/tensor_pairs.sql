-- The tensor file pairs the element kernel compares: rows with a tensor file on both sides and
-- equal shapes. Tables: selected_pairs (selected_pairs.sql: the selection's key_data_pairs).
SELECT DISTINCT file_a, file_b
FROM selected_pairs
WHERE in_a AND in_b AND file_a <> '' AND file_b <> '' AND shape_a IS NOT DISTINCT FROM shape_b
ORDER BY file_a, file_b
