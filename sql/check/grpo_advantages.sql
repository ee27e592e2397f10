-- Check grpo_advantages (fails): GRPO advantages sum to about 0 within each group of generations
-- for one prompt. Groups come from a saved `group_ids` tensor (the same save call as the
-- advantages) or, without one, from consecutive rows of the config's group size (a config leaf
-- num_generations, group_size or n_samples_per_prompt; `--param group_size=N`). A sequence's
-- advantage is the mean of its tokens' (GRPO broadcasts one value over the tokens). Needs tensors.
-- One row per group whose |mean| exceeds advantage_group_rtol x its mean |advantage| + advantage_group_atol.
-- Reads: group_advantages.
-- param advantage_group_rtol = 0.001 : allowed |group mean| relative to the group's mean |advantage|
-- param advantage_group_atol = 1e-06 : allowed |group mean| on top, absolute
SELECT step, rank, micro_step, "index", group_id, sequences, advantage_sum, advantage_mean, advantage_abs_mean,
       group_source
FROM group_advantages
WHERE sequences > 1
  AND (abs(advantage_mean) > getvariable('advantage_group_rtol') * advantage_abs_mean
                             + getvariable('advantage_group_atol')
       OR isnan(advantage_mean))
ORDER BY step, rank, micro_step, group_id
