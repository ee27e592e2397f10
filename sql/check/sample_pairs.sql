-- Not a check: the rollout's rows paired with the trainer's rows of the same sample, for trainers
-- that save the rollout and the (shuffled) update micro-batches in different save calls (TRL).
-- Joined on step, rank, sample identity and occurrence (the n-th row of that sample for the key in
-- the step) with equal row sizes; old_log_prob where saved for the sample, else log_prob (its first
-- occurrence in the step that generated: on-policy, no optimizer step between them). The response
-- mask row of the same sample, where saved. Reads: samples (the dump's `sample` rows with each
-- key's canonical name). No parameters. One row per paired sample.
WITH s AS (
  SELECT * FROM samples WHERE canonical IN ('rollout_log_prob', 'old_log_prob', 'log_prob', 'response_mask')
),
r AS (SELECT * FROM s WHERE canonical = 'rollout_log_prob'),
t AS (SELECT * FROM s WHERE canonical IN ('old_log_prob', 'log_prob')),
m AS (
  SELECT * FROM s WHERE canonical = 'response_mask'
  QUALIFY row_number() OVER (PARTITION BY step, rank, sample, occurrence ORDER BY micro_step, "index") = 1
),
with_old AS (SELECT DISTINCT step, rank, sample, occurrence FROM t WHERE canonical = 'old_log_prob')
SELECT CASE WHEN t.canonical = 'old_log_prob' THEN 'rollout_vs_old' ELSE 'rollout_vs_log_prob' END AS pair,
       r.step, r.rank, t.canonical AS a_key, t.micro_step AS a_micro, t."index" AS a_index, t.row AS a_row,
       r.micro_step AS b_micro, r."index" AS b_index, r.row AS b_row,
       m.micro_step AS m_micro, m."index" AS m_index, m.row AS m_row
FROM r
JOIN t ON t.step = r.step AND t.rank = r.rank AND t.sample = r.sample AND t.occurrence = r.occurrence
      AND t.row_numel = r.row_numel
LEFT JOIN with_old AS o ON o.step = r.step AND o.rank = r.rank AND o.sample = r.sample AND o.occurrence = r.occurrence
LEFT JOIN m ON m.step = r.step AND m.rank = r.rank AND m.sample = r.sample AND m.occurrence = r.occurrence
           AND m.row_numel = r.row_numel
WHERE t.canonical = 'old_log_prob' OR o.step IS NULL
ORDER BY pair, r.step, r.rank, a_micro, a_index, b_micro, b_index, a_row
