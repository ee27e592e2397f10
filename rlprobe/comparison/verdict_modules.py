"""The verdict after a module dump was compared (docs/modules.md, "After the module dump"): no
advice to take the dump the comparison already holds; a model whose every module matches is
declared fine, and the code around it (its inputs, the loss, the update) becomes the suspect."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

MATCHING = ("match", "stats_only_match", "close", "stats_only_close")  # close: within rounding
# what surrounds a model in each stage, where the difference must be when all its modules match
AROUND = {
    "actor_update": "the inputs assembled for the update (the batch, masks, old log-probs and advantages it is "
                    "given), the loss and its aggregation, gradient clipping and the optimizer step",
    "critic_update": "the inputs assembled for the critic's update (returns, old values, masks), the value loss "
                     "and its clipping, and the optimizer step",
}
AROUND_FORWARD = ("the inputs assembled for it (token ids, attention mask, position ids, padding) and the code "
                  "that turns its outputs into the key data (log-softmax and gather, temperature scaling, masking)")


def dumped_steps(modules: pa.Table | None) -> dict[tuple[str, int], bool]:
    """(stage, step) held by both runs' module dumps -> whether every compared module row matches."""
    found: dict[tuple[str, int], bool] = {}
    if modules is None or not modules.num_rows:
        return found
    for stage, step, status in zip(*(modules[c].to_pylist() for c in ("stage", "step", "status"))):
        found[(stage, step)] = found.get((stage, step), True) and status in MATCHING
    return found


def follow_up(summary: dict[str, Any], modules: pa.Table | None) -> None:
    """Rewrite advice and next_config in `summary` in place when the advised module dump is the
    one compared: point at the diverging module, or declare the model fine."""
    config = (summary.get("next_config") or {}).get("rlprobe_config") or {}
    stages, step = config.get("stages") or [], config.get("step_start")
    if len(stages) != 1 or step is None:
        return
    stage = stages[0]
    held = dumped_steps(modules)
    if (stage, step) not in held:
        return
    summary["next_config"] = None
    summary["module_dump_compared"] = {"stage": stage, "step": step, "all_match": held[(stage, step)]}
    first = summary.get("module_first_divergence")
    if not held[(stage, step)] and first is not None and first.get("weights"):
        from rlprobe.comparison.modules import weights_text

        summary["advice"] = (f"the advised module dump ({stage}, step {step}) is compared here, and no module is to "
                             f"blame: {weights_text(first['weights'])}")
        return
    if not held[(stage, step)] and first is not None:
        summary["advice"] = (f"the advised module dump ({stage}, step {step}) is compared here: start from the "
                             f"first diverging module, {first.get('module') or '(the whole model)'!r} "
                             "(its inputs and outputs per call are in modules.parquet and the Modules sheet)")
        return
    if not held[(stage, step)]:
        return
    around = AROUND.get(stage, AROUND_FORWARD)
    summary["model_fine"] = {"stage": stage, "step": step}
    summary["suspect"] = (f"{summary.get('suspect')}; but every module of the model in {stage} at step {step} "
                          f"matches in the module dump: that model is fine, the code around it differs")
    summary["advice"] = (f"the model of {stage} computes the same from the same inputs; look at the code around it: "
                         f"{around}")
