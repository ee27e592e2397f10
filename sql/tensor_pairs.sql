-- The tensor file pairs the element kernel compares: rows with a tensor file on both sides and
-- equal shapes, or a shape unknown on a side (an msprobe .npy without its statistics .json whose
-- header cannot be read: a FIFO, an empty or corrupt file), whose read then names the file in the
-- pair's error instead of leaving the pair to its (missing) statistics, which called it a match.
-- Tables: selected_pairs (selected_pairs.sql: the selection's key_data_pairs).
SELECT DISTINCT file_a, file_b
FROM selected_pairs
WHERE in_a AND in_b AND file_a <> '' AND file_b <> ''
  AND (shape_a IS NOT DISTINCT FROM shape_b OR shape_a IS NULL OR shape_b IS NULL)
ORDER BY file_a, file_b
