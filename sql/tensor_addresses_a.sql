-- Run A's tensor addresses (tensor_address, pair_macros.sql), in tensor_pairs.sql's order. With two workers each
-- is compared ahead with the same address in run B while the pairing SQL runs (compare/pairs_ahead.py); the SQL
-- still picks the pairs. Tables: stats_a.
SELECT DISTINCT tensor_address(tensor_file, tensor_offset, tensor_length) AS file
FROM stats_a
WHERE tensor_address(tensor_file, tensor_offset, tensor_length) <> ''
ORDER BY file
