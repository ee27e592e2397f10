-- Each run's layout: data-parallel ranks and micro-batches per step (the most micro_steps any
-- key has in a step on one rank), and how many samples the two runs hold at another position
-- (rank, micro_step, row) — a shuffled order with equal counts. Tables: stats_a, stats_b,
-- samples_a, samples_b (docs/compare.md, "Runs with different layouts").
WITH layout AS (
    SELECT 'A' AS run, count(DISTINCT rank) AS ranks,
           (SELECT coalesce(max(n), 0) FROM (SELECT count(DISTINCT micro_step) AS n FROM stats_a
                                             GROUP BY key, step, rank)) AS micro_batches
    FROM stats_a
    UNION ALL
    SELECT 'B', count(DISTINCT rank),
           (SELECT coalesce(max(n), 0) FROM (SELECT count(DISTINCT micro_step) AS n FROM stats_b
                                             GROUP BY key, step, rank))
    FROM stats_b
),
moved AS (
    SELECT count(*) AS moved_samples
    FROM samples_a AS a
    JOIN samples_b AS b USING (key, "index", step, sample, occurrence)
    WHERE a.rank <> b.rank OR a.micro_step <> b.micro_step OR a.row <> b.row
)
SELECT a.ranks AS ranks_a, a.micro_batches AS micro_batches_a, b.ranks AS ranks_b,
       b.micro_batches AS micro_batches_b, moved.moved_samples,
       (SELECT count(*) FROM samples_a) AS samples_a, (SELECT count(*) FROM samples_b) AS samples_b
FROM layout AS a, layout AS b, moved
WHERE a.run = 'A' AND b.run = 'B'
