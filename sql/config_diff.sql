-- The config diff: every config path whose value differs between run A and run B, on the ranks
-- that saved a config in both runs, one row per (path, value_a, value_b) with its ranks.
-- Inputs: configs_a / configs_b (rank, path, value as JSON text; the lake's configs table),
-- config_patterns (kind 'ignore' or 'family', family, label, pattern, position) from
-- rlprobe/comparison/config_families.yaml plus the user's ignore patterns. A pattern with no dot
-- matches the path's last part, one with a dot the path's end; both case-insensitively.
-- value_a / value_b are NULL where the path is absent in that run.
WITH both_ranks AS (
    SELECT rank FROM configs_a INTERSECT SELECT rank FROM configs_b
),
changed AS (
    SELECT coalesce(a.rank, b.rank) AS rank, coalesce(a.path, b.path) AS path, a.value AS value_a, b.value AS value_b
    FROM (SELECT * FROM configs_a WHERE rank IN (SELECT rank FROM both_ranks)) a
    FULL OUTER JOIN (SELECT * FROM configs_b WHERE rank IN (SELECT rank FROM both_ranks)) b
        ON a.rank = b.rank AND a.path = b.path
    WHERE a.value IS DISTINCT FROM b.value
),
matched AS (
    SELECT c.rank, c.path, c.value_a, c.value_b, p.kind, p.family, p.label, p.position
    FROM changed c
    LEFT JOIN config_patterns p
        ON CASE WHEN contains(p.pattern, '.')
                THEN lower(c.path) GLOB lower(p.pattern) OR lower(c.path) GLOB ('*.' || lower(p.pattern))
                ELSE lower(regexp_extract(c.path, '[^.]*$')) GLOB lower(p.pattern) END
),
per_path AS (
    SELECT rank, path, value_a, value_b,
           bool_or(kind = 'ignore') AS ignored,
           arg_min(family, position) FILTER (WHERE kind = 'family') AS family,
           arg_min(label, position) FILTER (WHERE kind = 'family') AS label
    FROM matched
    GROUP BY rank, path, value_a, value_b
)
SELECT path, value_a, value_b, list(rank ORDER BY rank) AS ranks, coalesce(bool_or(ignored), false) AS ignored,
       any_value(family) AS family, any_value(label) AS label
FROM per_path
GROUP BY path, value_a, value_b
ORDER BY path, value_a, value_b
