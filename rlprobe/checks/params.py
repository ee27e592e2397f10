"""The parameters of `rlprobe check` (--param, rlprobe.check() keywords, a pipeline's check.params): their
names and defaults, and what each value must be. Light to import: `rlprobe pipeline validate` checks a spec's
check.params with it, before anything is read."""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any

# run-level settings that are not any query's parameter (docs/check.md)
RUN_PARAMS = {"eps": None, "generation_every": None, "group_size": None, "ref_starts_as_actor": None, "workers": 2}
# what a parameter's value must be; every other one (eps and the queries' thresholds) a number >= 0, Infinity for no
# limit: NaN passed every threshold, a negative failed every one, a text reached DuckDB as a string
WHOLE_PARAMS = ("generation_every", "group_size", "workers")  # whole numbers >= 1
FLAG_PARAMS = ("ref_starts_as_actor",)  # true or false


def all_params() -> dict[str, Any]:
    """Every parameter `rlprobe check --param` accepts, with its default."""
    from rlprobe.checks.registry import CHECKS
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
