"""When a pair that is not bitwise equal is `close`: its difference is what rounding explains
(docs/across-devices.md, "Tolerances").

The measure is the max-norm relative error, max|a-b| / max(|a|inf, |b|inf): the kernel's max_abs_err
over the larger of both sides' largest magnitudes (from their min and max statistics), so a
near-zero element cannot inflate it. A pair is close when max_abs_err <= atol + rtol * scale, with
rtol = ULPS x eps of the dtype both runs saved it in, and atol = rtol x the family's scale floor: a
value smaller than its floor is judged as if it were of that size, since its error comes from inputs
of that size (a KL is the difference of two log-probs of order 1-10: floor 1; others 1/16, so that a
loss of 0.1 is judged nearly by its own size). Integer and bool dtypes, and the
token family, are exact. Statistics-only rows: each of min, max, mean within atol + rtol * scale and
the norm within atol + rtol * the larger norm. Overrides: --rtol/--atol (every float key but tokens),
per family, per key (saved name or canonical key); --stats-rtol for statistics-only rows only.

Only the standard library at import: the command builds its options before anything else loads."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

# machine epsilon (the spacing of numbers in [1, 2)) of each float dtype rlprobe reads
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "tf32": 2.0**-10, "float16": 2.0**-10, "bfloat16": 2.0**-7,
       "float8_e4m3fn": 2.0**-3, "float8_e5m2": 2.0**-2}
# rtol = ULPS x eps. Wide dtypes (accumulated in themselves): a reordered sum of K terms drifts by
# ~sqrt(K) eps of its norm (Higham 4.2), 64 for K = 4096, twice that for the few layers it compounds
# through. Narrow dtypes (accumulated wider, rounded once per op): a rounding that flips the last bit
# in each of a few layers, 4 ulps of the largest element.
WIDE, WIDE_ULPS, NARROW_ULPS = ("float64", "float32", "tf32"), 128, 4
# atol = rtol x the scale floor of a key's family: log-probs and what is made of their differences (a KL,
# a ratio) carry the rounding of log-probs of order 1-10; every other key the floor 1/16, so a loss of
# 0.1 moved by 5e-5 of itself (TRL's beta change, tests/integrations/test_trl_faults.py) is a divergence
# while the noise of a mean of differences (kl_loss, 2.6e-8 on 2e-3) stays within it
SCALE_FLOOR, SCALE_FLOORS = 2.0**-4, {"log_probs": 1.0}
# the coarser dtypes a float32/float64 pair's errors beyond tolerance are recognised as (a run that computed
# it in one of them): an error between float16's eps / 8 and bfloat16's rtol (sql/pair_macros.sql's
# coarser_rounding holds these numbers)
COARSER = ("float16", "bfloat16")

# key families (canonical keys, rlprobe/key_names.csv; docs/compare.md lists them)
FAMILIES: dict[str, tuple[str, ...]] = {
    "tokens": ("prompts", "responses", "input_ids", "attention_mask", "response_mask"),
    "log_probs": ("rollout_log_prob", "old_log_prob", "ref_log_prob", "log_prob", "kl", "ratio", "entropy"),
    "rewards_advantages": ("rewards", "token_level_scores", "token_level_rewards", "advantages", "returns"),
    "losses": ("pg_loss", "vf_loss", "kl_loss", "loss"),
    "values": ("values",),
}
EXACT_FAMILIES = ("tokens",)
FAMILY_OF = {key: family for family, keys in FAMILIES.items() for key in keys}


def default_rtol(dtype: str | None) -> float:
    """The relative tolerance of `dtype` (0 for integers, bools and unknown dtypes: exact)."""
    eps = EPS.get(dtype or "")
    if eps is None:
        return 0.0
    return (WIDE_ULPS if dtype in WIDE else NARROW_ULPS) * eps


def _number(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise ValueError(f"{name} must be a number >= 0, not {value!r}")
    number = float(value)
    if not number >= 0 or math.isinf(number):  # NaN too: DuckDB orders NaN above every number
        raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")
    return number


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_fields(value: Any, name: str, allowed: tuple[str, ...], expected: str) -> None:
    """ValueError naming `name` where `value` is no mapping, or holds a field not in `allowed`."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be {expected}, not {value!r}")
    unknown = sorted(set(value) - set(allowed), key=str)
    if unknown:
        raise ValueError(f"{name}: unknown field(s) {', '.join(map(str, unknown))}; expected {', '.join(allowed)}")


@dataclass(frozen=True)
class Rule:
    """An override: rtol and/or atol (None: from the level above)."""

    rtol: float | None = None
    atol: float | None = None

    @classmethod
    def of(cls, value: Any, name: str) -> "Rule":
        if isinstance(value, Rule):
            return value
        if _is_number(value):
            return cls(rtol=_number(value, f"{name}.rtol"))
        _check_fields(value, name, ("rtol", "atol"), "a number (its rtol) or a mapping with rtol and/or atol")
        return cls(_number(value.get("rtol"), f"{name}.rtol"), _number(value.get("atol"), f"{name}.atol"))


@dataclass(frozen=True)
class Resolved:
    """The tolerance one key of one dtype is judged by, and where it comes from (for the reports)."""

    rtol: float
    atol: float
    stats_rtol: float
    stats_atol: float
    source: str
    exact: bool = False  # an integer or bool dtype, or the token family: no control run's envelope loosens it


@dataclass(frozen=True)
class Tolerance:
    """Defaults per dtype, then --rtol/--atol, then per family, then per key (saved or canonical name)."""

    rtol: float | None = None
    atol: float | None = None
    stats_rtol: float | None = None  # statistics-only rows only (the former --stats-rtol)
    families: Mapping[str, Rule] = field(default_factory=dict)
    keys: Mapping[str, Rule] = field(default_factory=dict)

    @classmethod
    def of(cls, value: Any, name: str = "tolerance") -> "Tolerance":
        """A Tolerance from itself, None (the defaults), a number (rtol) or a mapping
        {rtol, atol, stats_rtol, families: {family: {rtol, atol}}, keys: {key: {rtol, atol}}};
        ValueError naming the field otherwise."""
        if value is None:
            return cls()
        if isinstance(value, Tolerance):
            return value
        if _is_number(value):
            return cls(rtol=_number(value, f"{name}.rtol"))
        _check_fields(value, name, ("rtol", "atol", "stats_rtol", "families", "keys"),
                      "a mapping (rtol, atol, stats_rtol, families, keys)")
        families = value.get("families") or {}
        keys = value.get("keys") or {}
        for what, given in (("families", families), ("keys", keys)):
            if not isinstance(given, Mapping):
                raise ValueError(f"{name}.{what} must be a mapping of names to {{rtol, atol}}, not {given!r}")
        wrong = sorted(set(families) - set(FAMILIES))
        if wrong:
            raise ValueError(f"{name}.families: unknown family {', '.join(map(str, wrong))}; "
                             f"the families are {', '.join(FAMILIES)}")
        return cls(_number(value.get("rtol"), f"{name}.rtol"), _number(value.get("atol"), f"{name}.atol"),
                   _number(value.get("stats_rtol"), f"{name}.stats_rtol"),
                   {str(f): Rule.of(r, f"{name}.families.{f}") for f, r in families.items()},
                   {str(k): Rule.of(r, f"{name}.keys.{k}") for k, r in keys.items()})

    def with_overrides(self, rtol: float | None = None, atol: float | None = None,
                       stats_rtol: float | None = None) -> "Tolerance":
        """This tolerance with the command line's --rtol, --atol, --stats-rtol (None: unchanged)."""
        from dataclasses import replace

        return replace(self, rtol=self.rtol if rtol is None else _number(rtol, "rtol"),
                       atol=self.atol if atol is None else _number(atol, "atol"),
                       stats_rtol=self.stats_rtol if stats_rtol is None else _number(stats_rtol, "stats_rtol"))

    def resolve(self, key: str, canonical: str | None, dtype: str | None) -> Resolved:
        """The tolerance of `key` (canonical key `canonical`) saved as `dtype`."""
        family = FAMILY_OF.get(canonical or key)
        if dtype is not None and dtype not in EPS:
            return Resolved(0.0, 0.0, 0.0, 0.0, f"exact ({dtype})", exact=True)
        rtol, atol, source = default_rtol(dtype), None, f"{dtype} default"
        if family in EXACT_FAMILIES:
            rtol, source = 0.0, f"exact ({family})"
        elif self.rtol is not None or self.atol is not None:
            rtol = rtol if self.rtol is None else self.rtol
            atol, source = self.atol, "--rtol/--atol"
        for level, rule in ((f"family {family}", self.families.get(family or "")),
                            (f"key {canonical}", self.keys.get(canonical or "")), (f"key {key}", self.keys.get(key))):
            if rule is not None and (rule.rtol is not None or rule.atol is not None):
                rtol = rtol if rule.rtol is None else rule.rtol
                atol = atol if rule.atol is None else rule.atol
                source = level
        floor = SCALE_FLOORS.get(family or "", SCALE_FLOOR)
        atol = rtol * floor if atol is None else atol
        exact = family in EXACT_FAMILIES or dtype is None
        if self.stats_rtol is None:
            return Resolved(rtol, atol, rtol, atol, source, exact)
        return Resolved(rtol, atol, self.stats_rtol, self.stats_rtol * floor, source, exact)

    def table(self, rows: Iterable[tuple[str, str | None, str | None]]) -> Any:
        """The table `key_tolerance` sql/key_data.sql joins: (key, dtype) -> rtol, atol, stats_rtol, stats_atol,
        tolerance_source, exact; `rows`: (saved key, canonical key, dtype)."""
        import pyarrow as pa

        out: dict[str, list[Any]] = {c: [] for c in ("key", "dtype", "rtol", "atol", "stats_rtol", "stats_atol",
                                                      "tolerance_source", "exact")}
        for key, canonical, dtype in rows:
            r = self.resolve(key, canonical, dtype)
            for column, value in zip(out, (key, dtype, r.rtol, r.atol, r.stats_rtol, r.stats_atol, r.source,
                                           r.exact)):
                out[column].append(value)
        types = {"key": pa.string(), "dtype": pa.string(), "tolerance_source": pa.string(), "exact": pa.bool_()}
        return pa.table({c: pa.array(v, types.get(c, pa.float64())) for c, v in out.items()})

