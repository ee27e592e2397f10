-- selected_pairs: key_data_pairs (the full outer join of both runs' statistics) of the selection,
-- made once as a table for tensor_pairs.sql and key_data.sql (each computed the join itself: most
-- of the time of both). Tables: stats_a, stats_b. Macros: pair_macros.sql, key_data_pairs.sql.
-- Parameters: $keys, $steps, $ranks (lists, NULL = all).
SELECT * FROM key_data_pairs($keys, $steps, $ranks)
