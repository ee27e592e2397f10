-- Within the first divergent step ($step): the diverging row of the lowest micro_step, which
-- can precede the first divergence in time when an upstream key diverges only in a later
-- micro-batch (the first divergence orders keys by dataflow before micro-batches).
SELECT key, step, rank, micro_step, "index", status
FROM key_data
WHERE step = $step AND status NOT IN ('match', 'close', 'stats_only_match', 'stats_only_close', 'absent_in_both')
ORDER BY micro_step, flow_position, key, rank, "index"
LIMIT 1
