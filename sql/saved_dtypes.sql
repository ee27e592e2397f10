-- Each (key, dtype) either run saved, with its canonical key (key_order): the rows of key_tolerance
-- (rlprobe/comparison/tolerance.py), the tolerance sql/key_data.sql judges those pairs by.
-- Tables: stats_a, stats_b, key_order.
SELECT s.key, coalesce(o.canonical, s.key) AS canonical, s.dtype
FROM (SELECT DISTINCT key, dtype FROM stats_a UNION SELECT DISTINCT key, dtype FROM stats_b) AS s
LEFT JOIN key_order AS o ON o.name = s.key
ORDER BY s.key, s.dtype
