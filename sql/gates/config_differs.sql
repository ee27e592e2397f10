-- Gate: the runs' configs differ. Returns every changed config path (both values as JSON text,
-- NULL where absent) less the ignore list (dump/output paths, logging dirs, run names,
-- timestamps: rlprobe/comparison/config_families.yaml; add patterns with the pipeline's
-- compare: {config: {ignore: [...]}}), with the family of settings it belongs to.
SELECT path, value_a, value_b, family, ranks
FROM config_diff
WHERE NOT ignored
ORDER BY path
