-- How two fingerprints of one weight tensor (digest of the raw bytes, float64 sum and L2 norm) are
-- judged, defined once for parameter updates (param_diff.sql) and the weights at a module's call
-- (module_weights.sql); docs/compare.md, "Parameter updates", gives the rule and its reasoning.
-- 'dtype_mismatch': the runs hold the tensor in different dtypes (a model kept in bfloat16 in one run).
-- 'match': equal digests (equal bytes). 'close': the digests differ and both the norm and the sum
-- agree within rtol of the tensor's own scale: |norm_a - norm_b| <= rtol x the larger norm, and
-- |sum_a - sum_b| <= rtol x the larger norm x sqrt(numel) (an upper bound of sum |x|, so a sum that
-- cancels to near zero is not judged by its own size). Weights have no natural scale floor, so there
-- is no absolute term. rtol 0: any other bit is 'differs'.
CREATE OR REPLACE TEMP MACRO fingerprint_status(in_a, in_b, shape_a, shape_b, dtype_a, dtype_b, digest_a, digest_b,
                                                sum_a, sum_b, norm_a, norm_b, numel, rtol) AS
    CASE
        WHEN NOT in_a THEN 'only_in_b'
        WHEN NOT in_b THEN 'only_in_a'
        WHEN shape_a IS DISTINCT FROM shape_b THEN 'shape_mismatch'
        WHEN dtype_a IS DISTINCT FROM dtype_b THEN 'dtype_mismatch'
        WHEN digest_a = digest_b THEN 'match'
        WHEN rtol > 0
             AND abs(norm_a - norm_b) <= rtol * greatest(abs(norm_a), abs(norm_b))
             AND abs(sum_a - sum_b) <= rtol * greatest(abs(norm_a), abs(norm_b)) * sqrt(numel) THEN 'close'
        ELSE 'differs'
    END;

-- the relative error of a fingerprint pair that the rule above compares with rtol: the larger of the
-- norm's and the sum's, each over its scale (0 for equal digests)
CREATE OR REPLACE TEMP MACRO fingerprint_rel_err(digest_a, digest_b, sum_a, sum_b, norm_a, norm_b, numel) AS
    CASE
        WHEN digest_a = digest_b THEN 0.0
        ELSE greatest(abs(norm_a - norm_b) / nullif(greatest(abs(norm_a), abs(norm_b)), 0),
                      abs(sum_a - sum_b) / nullif(greatest(abs(norm_a), abs(norm_b)) * sqrt(numel), 0))
    END;
