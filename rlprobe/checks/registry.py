"""Every check: one sql/check/ query returning the offending rows, registered here with what it
needs. A new check is one SQL file plus one line below. Then the parameters of `rlprobe check` (--param,
rlprobe.check() keywords, a pipeline's check.params): their names and defaults, and what each value must be
(check_params). Light to import: `rlprobe pipeline validate` checks a spec's check.params with it, before
anything is read."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Callable

# what a check can be applied to: the canonical keys and tables of one dump (rlprobe/checks/run.py)
Facts = dict


@dataclass(frozen=True)
class Check:
    name: str  # also sql/check/<name>.sql
    title: str
    severity: str  # "fail" or "warn"
    applies: Callable[[Facts], str | None]  # None: applicable; else why it is not
    token_level: bool = False  # its figures need tensors (statistics-only dumps: a note, or not applicable)

    @property
    def query(self) -> str:
        return f"{self.name}.sql"


def _keys(*groups: tuple[str, ...] | str) -> Callable[[Facts], str | None]:
    """Applicable when, for every group, one of its canonical keys is saved (not absent)."""
    def applies(facts: Facts) -> str | None:
        for group in groups:
            names = (group,) if isinstance(group, str) else group
            if not any(n in facts["keys"] for n in names):
                return f"no {' or '.join(names)} saved"
        return None
    return applies


def _any(facts: Facts) -> str | None:
    return None if facts["keys"] or facts["scalars"] else "no key data or scalars saved"


def _loss(facts: Facts) -> str | None:
    return None if facts["loss_names"] else "no loss saved or logged"


def _kl(facts: Facts) -> str | None:
    missing = _keys("kl")(facts)
    if missing:
        return missing
    if not facts["kl_applies"]:
        return ("the reference does not start as the actor (declared by config ref_starts_as_actor: false)"
                if facts["ref_declared"] else "the first step's ref_log_prob differs from old_log_prob/log_prob and "
                "no config says the reference starts as the actor (ref_starts_as_actor)")
    return None


def _groups(facts: Facts) -> str | None:
    missing = _keys("advantages")(facts)
    if missing:
        return missing
    if not facts["group_rows"] and "group_ids" not in facts["keys"] and not facts["group_size"]:
        return ("no GRPO groups known: save(..., group_ids=...) or set a config num_generations/group_size")
    if not facts["has_tensors"]:
        return "needs tensors (a statistics-only dump has no per-sequence advantages)"
    return None


def _grads(facts: Facts) -> str | None:
    return None if facts["grad_steps"] > 1 else "no gradient monitor with two steps or more"


def _signs(facts: Facts) -> str | None:
    return None if facts["sign_steps"] > 0 else "no gradient sign maps of consecutive steps (monitor level L1/L2)"


def _rollout(facts: Facts) -> str | None:
    missing = _keys("rollout_log_prob", ("old_log_prob", "log_prob"))(facts)
    if missing:
        return missing
    if not facts["rollout_pairs"]:
        return ("no rollout_log_prob paired with old_log_prob/log_prob: neither saved in the same call with the "
                "same shape nor the same sample (save(..., sample_ids=...)) in the same step with tensors")
    return None


def _entropy(facts: Facts) -> str | None:
    return None if "entropy" in facts["keys"] or facts["entropy_scalars"] else "no entropy saved or logged"


CHECKS: tuple[Check, ...] = (
    Check("nonfinite", "no NaN or inf in any key or scalar", "fail", _any),
    Check("loss_finite", "every loss is finite", "fail", _loss),
    Check("on_policy", "log_prob == old_log_prob where the run is on-policy", "fail",
          _keys("log_prob", "old_log_prob"), token_level=True),
    Check("rollout_vs_recompute", "the rollout engine's log-probs match the trainer's", "fail",
          _rollout, token_level=True),
    Check("kl_first_step", "KL == 0 at the first step when the reference starts as the actor", "fail", _kl),
    Check("grpo_advantages", "GRPO advantages sum to about 0 per group", "fail", _groups, token_level=True),
    Check("grad_norm_spike", "no gradient-norm spike", "fail", _grads),
    Check("grad_sign_drop", "no sudden drop of gradient sign agreement between steps", "fail", _signs),
    Check("entropy_collapse", "entropy does not collapse", "warn", _entropy),
    Check("reward_up_kl_explodes", "reward does not rise while KL explodes", "warn", _keys("rewards", "kl")),
)


# run-level settings that are not any query's parameter (docs/check.md)
RUN_PARAMS = {"eps": None, "generation_every": None, "group_size": None, "ref_starts_as_actor": None, "workers": 2}
# what a parameter's value must be; every other one (eps and the queries' thresholds) a number >= 0, Infinity for no
# limit: NaN passed every threshold, a negative failed every one, a text reached DuckDB as a string
WHOLE_PARAMS = ("generation_every", "group_size", "workers")  # whole numbers >= 1
FLAG_PARAMS = ("ref_starts_as_actor",)  # true or false


def all_params() -> dict[str, Any]:
    """Every parameter `rlprobe check --param` accepts, with its default."""
    from rlprobe.lake.sql_runner import query_params

    found = dict(RUN_PARAMS)
    for check in CHECKS:
        found.update(query_params(f"check/{check.query}"))
    return found


def check_params(params: dict[str, Any]) -> None:
    """ValueError for a parameter no check takes (naming those it takes) or a value that does not fit its
    parameter (naming both and what it takes); None is the default."""
    known = all_params()
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"unknown check parameter(s) {unknown}; expected one of {sorted(known)}")
    for name, value in params.items():
        if value is None:
            continue
        if name in FLAG_PARAMS:
            fits, expected = isinstance(value, bool), "true or false"
        elif name in WHOLE_PARAMS:
            fits, expected = isinstance(value, Integral) and not isinstance(value, bool) and value >= 1, \
                "a whole number >= 1"
        else:
            fits = isinstance(value, Real) and not isinstance(value, bool) and value >= 0  # not NaN either
            expected = "a number >= 0 (JSON, e.g. 0.1 or 1e-6; Infinity for no limit)"
        if not fits:
            raise ValueError(f"check parameter {name}={value!r}: expected {expected}")
