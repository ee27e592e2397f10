-- The first row of a token key ($tokens: the exact family's canonical keys) where control run C differs
-- from run A (A-vs-C's key_data): C's sampling parted under its noise, so from that step on C is no
-- noise-only control (rlprobe/comparison/control_run.py). Steps C lacks (only_in_a) are no parting.
-- Tables: key_data.
SELECT key, step, status
FROM key_data
WHERE step >= 0 AND list_contains($tokens, canonical_key)
  AND status NOT IN ('match', 'stats_only_match', 'absent_in_both', 'only_in_a', 'only_in_b', 'error')
ORDER BY step, flow_position, key, rank, micro_step, "index"
LIMIT 1
