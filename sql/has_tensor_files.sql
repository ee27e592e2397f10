-- Whether both runs saved a tensor file for some key-data row (a statistics-only dump has none,
-- so its pairs are never looked at twice). Tables: stats_a, stats_b.
SELECT EXISTS (SELECT 1 FROM stats_a WHERE tensor_file <> '')
   AND EXISTS (SELECT 1 FROM stats_b WHERE tensor_file <> '') AS both_have_files
