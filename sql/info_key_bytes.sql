-- Bytes of each key's tensor files for `rlprobe info`: the rows' tensor_file joined with
-- `tensor_sizes` (path relative to the dump root, size in bytes), registered from one walk of the
-- dump's tensors/key_data folder. Keys without files are left out (0 bytes).
SELECT
    k.key,
    sum(s.size) AS bytes
FROM key_data AS k
JOIN tensor_sizes AS s ON s.path = k.tensor_file
GROUP BY k.key
