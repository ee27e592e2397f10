-- One run's key-data statistics of committed steps: the parts $files (each with its rank in
-- _part_rank), conformed to key data's columns $columns (_key_data_columns: an empty table of
-- them, so a column older parts lack reads as null). _committed: the committed step ranges of
-- each rank (empty: every step; a rank without a range keeps all its steps).
SELECT COLUMNS(lambda c: list_contains($columns, c))
FROM (SELECT * FROM _key_data_columns
      UNION ALL BY NAME
      SELECT * FROM read_parquet($files, filename = true, union_by_name = true, hive_partitioning = false))
JOIN _part_rank USING (filename)
WHERE _part_rank.rank NOT IN (SELECT rank FROM _committed)
   OR EXISTS (SELECT 1 FROM _committed c WHERE c.rank = _part_rank.rank AND step BETWEEN c.first_step AND c.last_step)
