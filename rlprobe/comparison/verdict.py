"""From the first divergence to words: which stage is suspect and what to capture next.

The rules follow the PPO data flow: a key diverging while everything upstream of it at the
same step agrees points at the code that produces that key; where the first divergence is only its
inputs' rounding carried on (a tight tolerance, noise a little larger than the defaults), the key
whose error jumps far above its inputs' (amplification.py) is the suspect instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rlprobe.comparison.amplification import AMPLIFICATION, KeyErrors, against_inputs, amplification_point, error_jump
from rlprobe.comparison.key_aliases import UPSTREAM_OF


@dataclass(frozen=True)
class Suspect:
    what: str  # the stage or code, in words
    stage: str | None  # the module-dump stage that would show which layer differs
    advice: str


RULES: dict[str, Suspect] = {
    "prompts": Suspect(
        "the input data: the prompts differ (data loading, shuffling or dataset order)", None,
        "check the data seed, the sampler and the dataset version; nothing downstream can match while the prompts differ"),
    "responses": Suspect(
        "rollout sampling: generation produced different tokens from the same prompts", None,
        "check the sampling seed and generation settings (temperature, top-p, max length) and the inference engine; "
        "if those are identical, compare the rollout model's logits"),
    "rewards": Suspect(
        "the reward: the reward model's forward or the rule-based reward function", "reward_compute",
        "dump the reward model's modules for this step"),  # which of them a run has: reward_rule
    "values": Suspect("the critic's forward (value estimates)", "critic_compute_values",
                      "dump the critic's modules for this step"),
    "old_log_prob": Suspect("the actor's forward when computing log-probs of the rollouts", "actor_compute_log_prob",
                            "dump the actor's modules during log-prob computation for this step"),
    "ref_log_prob": Suspect("the reference model's forward", "reference_compute_log_prob",
                            "dump the reference model's modules for this step"),
    "kl": Suspect("the KL computation (both log-probs it is made from match)", None,
                  "check the KL estimator and its coefficient in the config"),
    "token_level_rewards": Suspect(
        "the KL penalty's application (token_level_rewards = token_level_scores - KL coefficient * kl): "
        "the scores and the KL it is made from match", None,
        "check the KL coefficient (kl_coef, beta, init_kl_coef), its controller (fixed or adaptive) and the KL "
        "estimator the penalty uses (kl_penalty) in the config"),
    "rollout_log_prob": Suspect(
        "the inference engine's log-probs (vLLM, SGLang or the rollout model): its precision, its kernels or its "
        "weights (a missed weight sync)", None,
        "compare the rollout engine's dtype and settings and the weight sync after each update"),
    "advantages": Suspect(
        "the advantage computation (GAE or group normalisation), not a model: its inputs agree", None,
        "check gamma, lambda, whitening and the advantage estimator in the config (configs table)"),
    "returns": Suspect("the return computation, not a model: its inputs agree", None,
                       "check gamma and lambda in the config"),
    "log_prob": Suspect("the actor's forward during the update", "actor_update",
                        "dump the actor's modules during the update for this step"),
}
LOSSES = {"ratio", "pg_loss", "vf_loss", "kl_loss", "entropy", "loss"}
RULES["token_level_scores"] = RULES["rewards"]


def explain(first: dict[str, Any] | None, errors: KeyErrors | None, within: Any,
            difference: dict[str, Any] | None = None, *, config_diff: Any = None,
            shared_prefix: Callable[[int], dict[str, Any] | None] | None = None,
            reward_source: Callable[[], str | None] | None = None) -> dict[str, Any]:
    """suspect, advice, next_config, amplification, error_jump and parting for a first divergence (beyond
    tolerance); without one, `difference` (the first bitwise difference, within rounding) is named in the advice.

    `errors`: the errors per step and per key (amplification.KeyErrors; None without a first divergence);
    `within`: what each run shows about itself (single_run.SingleRunFindings: the on_policy and
    rollout_vs_recompute rules of rlprobe check, per run); `config_diff`: config_diff.diff_configs' table;
    `shared_prefix(step)`: parting.shared_prefix_log_probs at that step; `reward_source()`:
    config_diff.reward_source of both runs (which scoring they have: "model", "function" or None)."""
    found = {"amplification": None, "error_jump": None, "parting": None}
    if first is None and difference is not None:
        advice = ("no divergence beyond rounding: every difference is within the tolerance of its dtype "
                  "(docs/across-devices.md, Tolerances); key_data's close rows give each one's error against it")
        unsteady = sorted(name for name, rows in (getattr(within, "on_policy", None) or {}).items() if rows)
        if unsteady:  # a reduction order that changes per call is rounding too: only a bitwise comparison tells
            advice += (f"; note: the actor of run {' and of run '.join(unsteady)} recomputes its log-probs on-policy "
                       "not bit for bit "
                       "(rlprobe check): where both runs ran on one device, compare bitwise (--rtol 0 --atol 0) "
                       "to find a nondeterministic kernel")
        return {"suspect": None, "advice": advice, "next_config": None, **found}
    if first is None:
        return {"suspect": None, "advice": "the runs agree on every compared value", "next_config": None, **found}
    key, canon, step = first["key"], first["canonical_key"], first["step"]
    where = f"step {step}, rank {first['rank']}, micro_step {first['micro_step']}"
    unpaired = _unpaired(first, where, config_diff)
    if unpaired is not None:  # no values compared: the pair itself says what differs
        return {**unpaired, "next_config": None, **found}
    found["error_jump"] = error_jump(errors)
    found["amplification"] = amplification_point(errors, step)
    head = _amplified(first, errors, found)
    if head is not None:  # the first divergence is its inputs' rounding carried on: the amplification point leads
        amp = found["amplification"]
        amp["leads"] = True  # the config diff's causes are then this key's (config_diff.explain_config)
        key, canon, step = amp["key"], amp["canonical_key"], amp["step"]
    at_step = errors.at(step)
    inputs = [k for k in UPSTREAM_OF.get(canon, ()) if k in at_step and not at_step[k]["diverged"]]
    if canon == "token_level_rewards" and len(inputs) < 2:  # the penalty's inputs were not both captured
        missing = [k for k in UPSTREAM_OF[canon] if k not in inputs]
        rule = Suspect("the code that produces 'token_level_rewards' (the scores minus the KL penalty)", None,
                       f"capture {' and '.join(missing)} as key data too: with both identical the KL penalty's "
                       "application is the suspect")
    elif canon in ("rewards", "token_level_scores"):
        rule = reward_rule(reward_source() if reward_source is not None else None)
    else:
        rule = RULES.get(canon)
    same = _agreeing(inputs, at_step)
    if canon == "responses" and step > 0 and not at_step.get("prompts", {}).get("diverged"):
        suspect, found["parting"] = _parting(step, errors, config_diff,
                                             shared_prefix(step) if shared_prefix is not None else None)
    elif rule is not None:
        suspect = rule
    elif canon in LOSSES:
        suspect = Suspect(f"the loss computation for {key!r}: the data it is computed from matches", "actor_update",
                          "check the loss settings (clip ratio, coefficients, aggregation) in the config")
    else:
        suspect = Suspect(f"the code that produces {key!r}", None, f"capture the inputs of {key!r} as key data too")
    engine = rollout_suspect(within, step)
    if engine is not None:  # a rollout engine that disagrees with its own trainer explains what follows
        suspect, found["parting"] = engine, None
    what = suspect.what
    if canon in ("old_log_prob", "log_prob") and within.on_policy:
        what += "; " + "; ".join(_on_policy_text(name, rows[0]) for name, rows in sorted(within.on_policy.items()))
    advice = suspect.advice
    next_config = None
    if suspect.stage:
        next_config = {"rlprobe_config": {"dump_path": "./rlprobe_dump_modules", "key_data_dump": True,
                                          "stages": [suspect.stage], "step_start": step, "step_end": step}}
        advice += f" (rlprobe_config below: stage {suspect.stage}, step {step})"
    jump, parting = found["error_jump"], found["parting"]
    if jump is not None and parting is not None and jump["step"] >= parting["step"]:
        jump["consequence_of"] = f"responses at step {parting['step']}"
    advice += _jump_text(jump)
    shown = key if key == canon else f"{key} (as {canon})"
    if parting is not None and parting["cause"] == "sampling":
        text = what
    elif head is not None:
        text = head.replace("{what}", what)
    else:
        text = f"{shown} diverges first at {where}{same} -> {what}"
    return {"suspect": text, "advice": advice, "next_config": next_config, **found}


def _unpaired(first: dict[str, Any], where: str, config_diff: Any) -> dict[str, str] | None:
    """suspect and advice where the first divergence is no pair of values: a row one run lacks or saved as
    None, a file that cannot be read, shapes that differ (a changed seed: the data order)."""
    key, status = first["key"], first["status"]
    if status in ("only_in_a", "only_in_b"):
        missing = "B" if status == "only_in_a" else "A"
        return {"suspect": f"the runs captured different data: run {missing} has no {key!r} at {where}",
                "advice": "compare like with like: the same keys, steps and ranks (use --keys/--steps/--ranks), "
                          "or find why one run stopped or skipped saving"}
    if status in ("absent_in_a", "absent_in_b"):
        none_in, value_in = ("A", "B") if status == "absent_in_a" else ("B", "A")
        return {"suspect": f"the runs computed different data: run {none_in} saved None (not computed) for {key!r} "
                           f"at {where}, run {value_in} a value",
                "advice": "compare the two configs for the setting that switches this value on (a KL or reference "
                          "model option, a critic, a loss term): the trainers did not run the same computation"}
    if status == "error":
        return {"suspect": f"a file could not be read ({first.get('message')})",
                "advice": "fix or re-capture the unreadable file; the other rows are still compared"}
    if status != "shape_mismatch":
        return None
    changed = _changed(config_diff)
    seeds = [r for r in changed if r["family"] == "seed"]
    if seeds and not any(r["family"] == "batch" for r in changed):
        return {"suspect": f"{key!r} has different shapes at {where}: the data order differs, because the seed "
                           f"differs ({_settings(seeds)}): other samples, of other lengths, fill the batches",
                "advice": "set the seed alike in both runs (or fix the data order) and compare again"}
    return {"suspect": f"{key!r} has different shapes at {where}: the runs used different batch or sequence sizes",
            "advice": "check micro-batch size, sequence lengths and padding in both configs"}


def reward_rule(source: str | None) -> Suspect:
    """The rewards' suspect for what the runs score with (config_diff.reward_source): a reward model
    (its forward, and any rule beside it), reward functions only (no model to dump), or unknown."""
    if source == "function":
        return Suspect("the reward function (rule-based; the saved configs name no reward model): its code, its "
                       "settings or its inputs (the responses, the dataset's answers)", None,
                       "compare the reward functions' code, versions and settings and the dataset's reference "
                       "answers in both runs")
    if source == "model":
        return Suspect("the reward: the reward model's forward (or a rule-based reward beside it)", "reward_compute",
                       "dump the reward model's modules for this step")
    return RULES["rewards"]


def _parting(step: int, errors: KeyErrors, config_diff: Any,
             prefix: dict[str, Any] | None) -> tuple[Suspect, dict[str, Any] | None]:
    """Responses that part at `step` > 0 from the same prompts, every earlier key within tolerance: the update
    after step - 1 where every earlier key matched bitwise or where the dump shows the weights differ (a
    changed setting of the update in the config diff, the policy's log-probs of the shared tokens beyond
    rounding: amplification.py, shared_prefix_log_probs); else sampling under rounding noise. The parting's `consequences`: the keys that
    diverge at `step`, as the other tokens make them (and every later step's keys)."""
    if all(r["bitwise"] for s, r in errors.per_step.items() if s < step):
        return _update(step, None), None
    from rlprobe.comparison.config_diff import causes

    settings = [] if config_diff is None else causes(config_diff, {"canonical_key": "responses", "step": step})
    consequences = sorted(r["key"] for r in errors.at(step).values()
                          if r["diverged"] and r["canonical_key"] != "responses")
    evidence = []
    if settings:
        evidence.append(f"a changed setting of the config diff ({', '.join(r['path'] for r in settings[:3])})")
    if prefix is not None:
        evidence.append(f"the policy's log-probs of the tokens both runs share at step {step} ({prefix['key']}, "
                        f"{prefix['positions']} positions) differ by max |Δ| {prefix['max_abs_err']:.3g} "
                        f"{'<=' if prefix['within'] else '>'} their tolerance {prefix['bound']:.3g}")
    parting = {"step": step, "evidence": evidence, "consequences": consequences}
    if settings or (prefix is not None and not prefix["within"]):
        return _update(step, evidence), {**parting, "cause": "update"}
    shown = f" ({'; '.join(evidence)})" if evidence else ""
    return Suspect(
        f"responses differ from step {step} (sampling under rounding noise: every earlier key is within rounding); "
        f"replay the baseline's rollout to compare the trainer past it{shown}", None,
        "replay run A's rollout in run B (Probe(replay_from=RUN_A), rlprobe_config.replay_from, the PPO example's "
        "--replay-from; docs/replay.md) and compare again: the trainer side is then compared on the same tokens; "
        f"from step {step} on, {', '.join(consequences) or 'no other key'} differ as the consequence of the other "
        "tokens, not as faults of their own"), {**parting, "cause": "sampling"}


def _amplified(first: dict[str, Any], errors: KeyErrors, found: dict[str, Any]) -> str | None:
    """The suspect's text around "{what}" where the first divergence, a float key, is no more than its inputs'
    rounding carried on (a ratio under AMPLIFICATION) and an amplification point lies at its step or, without
    one there, at the error jump's later step (set in `found`); None where the first divergence leads."""
    canon, step = first["canonical_key"], first["step"]
    at_step = errors.at(step)
    own = against_inputs(at_step[canon], at_step) if canon in at_step else None
    if own is None or own["ratio"] >= AMPLIFICATION:
        return None
    jump = found["error_jump"]
    if found["amplification"] is None and jump is not None and jump["step"] > step:
        found["amplification"] = amplification_point(errors, jump["step"])
    amp = found["amplification"]
    if amp is None:
        return None
    where = f"step {amp['step']}, rank {amp['rank']}, micro_step {amp['micro_step']}"
    inputs = (f"the largest of its inputs ({amp['upstream_key']} {amp['upstream_error']:.3g})" if amp["upstream_key"]
              else "its dtype's rounding while its inputs are equal")
    return (f"the error of {amp['key']} jumps at {where}: {amp['error']:.3g}, {amp['ratio']:.3g}x {inputs} -> "
            f"{{what}}; the first divergence beyond tolerance, {first['key']} at step {step} "
            f"({_error(at_step[canon])}), is no more than its inputs' rounding carried on ({own['ratio']:.3g}x "
            f"theirs, under the amplification factor {AMPLIFICATION:g})")


def _jump_text(jump: dict[str, Any] | None) -> str:
    if jump is None:
        return ""
    because = f", the consequence of the {jump['consequence_of']}" if jump.get("consequence_of") else ""
    return (f"; errors jump at step {jump['step']}: the largest, {jump['key']} {jump['error']:.3g}, is "
            f"{jump['ratio']:.3g}x the previous step's ({jump['previous_error']:.3g}){because}")


def _agreeing(inputs: list[str], at_step: dict[str, dict[str, Any]]) -> str:
    """' (a, b identical; c within rounding)' for the inputs of a key that agree at its step."""
    equal = [k for k in inputs if at_step[k]["bitwise"]]
    close = [k for k in inputs if not at_step[k]["bitwise"]]
    parts = [f"{', '.join(equal)} identical"] * bool(equal) + [f"{', '.join(close)} within rounding"] * bool(close)
    return f" ({'; '.join(parts)})" if parts else ""


def _error(row: dict[str, Any]) -> str:
    return "error ?" if row.get("error") is None else f"error {row['error']:.3g}"


def _changed(config_diff: Any) -> list[dict[str, Any]]:
    if config_diff is None:
        return []
    from rlprobe.comparison.config_diff import changed

    return changed(config_diff)


def _settings(rows: list[dict[str, Any]]) -> str:
    from rlprobe.lake.configs import value_text

    return "; ".join(f"{r['path']}: A={value_text(r['value_a'])}, B={value_text(r['value_b'])}" for r in rows[:3])


def settle_parting(summary: dict[str, Any]) -> None:
    """Once the parameter fingerprints are compared (params.py): responses named as parting by sampling
    whose policy's weights already differ after an update before the parting (`param_first_difference`:
    beyond rounding, and not rounding noise the optimizer amplified: `update_noise`) part by that update; `parting` and, where params.explain_update left it, the suspect
    say so. In place."""
    parting, update = summary.get("parting"), summary.get("param_first_difference")
    if parting is None or parting["cause"] != "sampling" or update is None or summary.get("update_noise"):
        return  # weights that differ by amplified rounding (params.update_noise) are noise the tokens part under
    if update.get("probe_step") is None or update["probe_step"] >= parting["step"]:
        return
    parting["cause"] = "update"
    parting["evidence"].append(f"the parameter fingerprints of model {update['monitor']!r} differ after the update "
                               f"of step {update['probe_step']} (first parameter {update['param']!r})")
    if str(summary.get("suspect") or "").startswith(f"responses differ from step {parting['step']} (sampling"):
        suspect = _update(parting["step"], parting["evidence"])
        summary["suspect"], summary["advice"] = suspect.what, suspect.advice


def _update(step: int, evidence: list[str] | None) -> Suspect:
    """The update after step - 1 as the suspect of responses that part at `step`: with every earlier key
    bitwise equal (`evidence` None), or within rounding and `evidence` that the weights differ."""
    what = (f"all key data up to step {step - 1} matched, yet new rollouts differ" if evidence is None else
            f"every key up to step {step - 1} is within rounding, yet new rollouts differ and the weights differ: "
            + "; ".join(evidence))
    return Suspect(f"the parameter update after step {step - 1}: {what}", None,
                   "compare the optimizer settings (learning rate, schedule, clipping) and the weight sync to the "
                   f"rollout engine; monitor gradients (monitor_grads) around step {step - 1}")


def rollout_suspect(within: Any, step: int) -> Suspect | None:
    """The rollout engine of a run, when it disagrees with its trainer (rollout_vs_recompute) at or
    before `step` while the other run's does not: it generated from other weights or another precision."""
    for name, rows in sorted(within.rollout.items()):
        early = [r for r in rows if r["step"] <= step]
        others = [r for other, found in within.rollout.items() if other != name for r in found if r["step"] <= step]
        if not early or others:
            continue
        worst = max(early, key=lambda r: _number(r.get("max_abs") if r.get("max_abs") is not None
                                                 else r.get("mean_abs")))
        figure = (f"max |Δ| {_number(worst['max_abs']):.3g}" if worst.get("max_abs") is not None
                  else f"mean |Δ| ≥ {_number(worst.get('mean_abs')):.3g} (statistics)")
        baselines = {other: v for other, v in within.rollout_max_abs.items() if other != name and v is not None}
        runs = ", ".join(sorted(baselines))
        baseline = f", baseline ≤ {max(baselines.values()):.3g} (run {runs})" if baselines else ""
        return Suspect(
            f"run {name}'s rollout engine disagrees with its trainer: {figure} at step {worst['step']} "
            f"(rank {worst['rank']}, rollout_log_prob - trainer log-prob){baseline}", None,
            f"check run {name}'s weight sync from the trainer to the rollout engine after each update, and the "
            f"engine's dtype and kernels (`rlprobe check` on run {name} shows every step)")
    return None


def _on_policy_text(name: str, row: dict[str, Any]) -> str:
    dtype = row.get("log_prob_dtype") or "its dtype"
    size = (f"within {dtype} rounding" if row.get("within_tolerance")
            else f"> tolerance {_number(row.get('tolerance')):.3g}")
    return (f"in run {name} log_prob differs from old_log_prob where the run is on-policy (step {row['step']}, "
            f"rank {row['rank']}, max |Δ| {_number(row.get('max_abs_diff')):.3g}, {size}): "
            "the actor's recomputation is not deterministic")


def _number(value: Any) -> float:
    return float("nan") if value is None else float(value)


def explain_beyond_key_data(summary: dict[str, Any], grad_probe_step: int | None = None) -> None:
    """When the key data agree (or none were compared), say what the module dumps or the
    gradient monitors found instead of "the runs agree": sets suspect, advice and next_config
    in `summary` in place. `grad_probe_step`: the probe step of the first flagged gradient step."""
    if summary.get("first_divergence") is not None:
        return
    module, grad = summary.get("module_first_divergence"), summary.get("grad_first_flagged")
    key_data = "the compared key data agree" if summary.get("counts") else "no key data were compared"
    if module is not None:
        summary["suspect"] = summary.get("module_suspect") or summary.get("suspect")
        summary["advice"] = (f"{key_data} but the module dumps part ways: start from that module "
                             "(its inputs and outputs per call are in modules.parquet and the Modules sheet)")
        return
    layout = summary.get("layout") or {}
    if grad is None:
        if layout.get("note") and summary.get("suspect") is None:  # a layout change is no divergence
            grads = ", and so do the gradients compared" if layout.get("grads") else ""
            summary["advice"] = f"{key_data} within the layout tolerance{grads}: {layout['note']}"
        return
    monitor, step, rank = grad["monitor"], grad["step"], grad["rank"]
    compared = f"; {grad['compared']}" if grad.get("compared") else ""
    summary["suspect"] = (f"the gradients of monitor {monitor!r} part ways at its optimizer step {step} "
                          f"(rank {rank}): {grad.get('reason')}{compared}")
    stage = "critic_update" if "critic" in str(monitor).lower() else "actor_update"
    summary["advice"] = (f"{key_data} but the gradients part ways: dump the modules of that "
                         f"update ({stage}) at that step to find the first module whose backward differs; "
                         "every parameter's similarity per step is in grads.parquet and the Grad similarity sheet")
    if grad_probe_step is not None:
        summary["next_config"] = {"rlprobe_config": {"dump_path": "./rlprobe_dump_modules", "stages": [stage],
                                                     "step_start": grad_probe_step, "step_end": grad_probe_step}}
        summary["advice"] += f" (rlprobe_config below: stage {stage}, probe step {grad_probe_step})"
