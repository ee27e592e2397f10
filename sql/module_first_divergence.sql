-- The first diverging module tensor in run A's execution order (step, seq, inputs before
-- outputs), with whether that module call's inputs matched: "inputs equal, output differs"
-- pins the layer (close: within rounding, rlprobe/comparison/tolerance.py, agrees). For a backward call its inputs are the grad_output rows. Empty when the runs agree.
-- Table: modules (modules.sql).
WITH first AS (
    SELECT *
    FROM modules
    WHERE status NOT IN ('match', 'close', 'stats_only_match', 'stats_only_close')
    ORDER BY step, seq, io_order, rank, stage, "index"
    LIMIT 1
)
SELECT f.stage, f.step, f.rank, f.module, f.call, f.direction, f.io, f."index", f.status, f.seq,
       f.max_abs_err, f.max_rel_err, f.message,
       (SELECT CASE WHEN count(*) = 0 THEN NULL ELSE bool_and(m.status IN ('match', 'close', 'stats_only_match', 'stats_only_close')) END
        FROM modules AS m
        WHERE m.stage = f.stage AND m.step = f.step AND m.rank = f.rank AND m.module = f.module
          AND m.call = f.call AND m.direction = f.direction
          AND m.io = CASE WHEN f.direction = 'backward' THEN 'grad_output' ELSE 'input' END) AS inputs_match
FROM first AS f
