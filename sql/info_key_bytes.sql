-- Bytes of each key's tensor files for `rlprobe info`: the rows' tensor_file joined with
-- `tensor_sizes` (path relative to the dump root, size in bytes), registered from one walk of the
-- dump's tensors/key_data folder; a record of a packed file (tensor_offset set) counts its own
-- tensor_length, not the file's. Keys without files are left out (0 bytes).
SELECT
    k.key,
    sum(CASE WHEN k.tensor_offset IS NULL THEN s.size ELSE k.tensor_length END) AS bytes
FROM key_data AS k
JOIN tensor_sizes AS s ON s.path = k.tensor_file
GROUP BY k.key
