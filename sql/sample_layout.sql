-- Each run's layout: data-parallel ranks and micro-batches per step (the most micro_steps any
-- key has in a step on one rank), the samples a micro-batch holds (the most sample rows of one call among
-- the keys saved in the most micro-batches; NULL without sample rows), and how many samples the two runs
-- hold at another position (rank, micro_step, row) — a shuffled order with equal counts. Tables: stats_a,
-- stats_b, samples_a, samples_b (docs/compare.md, "Runs with different layouts").
WITH calls AS (
    SELECT 'A' AS run, key, step, rank, count(DISTINCT micro_step) AS micro_steps, max(n) AS n
    FROM (SELECT key, step, rank, micro_step, count(*) AS n FROM samples_a GROUP BY ALL) GROUP BY ALL
    UNION ALL
    SELECT 'B', key, step, rank, count(DISTINCT micro_step), max(n)
    FROM (SELECT key, step, rank, micro_step, count(*) AS n FROM samples_b GROUP BY ALL) GROUP BY ALL
),
micro_batch_size AS (
    SELECT run, max(n) AS size FROM calls AS c
    WHERE micro_steps = (SELECT max(micro_steps) FROM calls AS d WHERE d.run = c.run)
    GROUP BY run
),
layout AS (
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
       (SELECT size FROM micro_batch_size WHERE run = 'A') AS micro_batch_size_a,
       (SELECT size FROM micro_batch_size WHERE run = 'B') AS micro_batch_size_b,
       (SELECT count(*) FROM samples_a) AS samples_a, (SELECT count(*) FROM samples_b) AS samples_b
FROM layout AS a, layout AS b, moved
WHERE a.run = 'A' AND b.run = 'B'
