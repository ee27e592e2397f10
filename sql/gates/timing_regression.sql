-- Gate: a timing that rose. Returns one row per timing metric (names starting with
-- getvariable('timing_prefix'), default 'timing/') whose mean in run B is more than
-- getvariable('timing_max_rise') (default 0.10, i.e. 10%) above run A's.
-- Change the defaults in the pipeline: params: {timing_prefix: timing/, timing_max_rise: 0.10}.
-- param timing_prefix = "timing/" : the prefix of the timing metrics compared
-- param timing_max_rise = 0.10 : the largest rise of a timing mean in run B (0.10: 10%)
SELECT
    name,
    avg(value_a)                     AS mean_a,
    avg(value_b)                     AS mean_b,
    avg(value_b) / avg(value_a) - 1  AS change,
    getvariable('timing_max_rise')   AS allowed_change
FROM scalars
WHERE starts_with(name, getvariable('timing_prefix'))
  AND value_a IS NOT NULL AND value_b IS NOT NULL
GROUP BY name
HAVING avg(value_b) > avg(value_a) * (1 + getvariable('timing_max_rise'))
ORDER BY name
