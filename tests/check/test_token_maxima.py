"""check_dump(only=..., maxima_only=True) (rlprobe/checks/token_maxima.py): the on_policy pairs reduced to their
token count and max |Δ| give the figures of the full reduction and the same rule results."""

from __future__ import annotations

import numpy as np
import pytest

from rlprobe.checks.compiled import reduce_pair
from rlprobe.checks.run import check_dump
from rlprobe.checks.token_maxima import reduce_maxima

from tests.check.test_token_selection import RULES, _msprobe_run, _rlprobe_run


def _pairs():
    """(a, b, mask) of both float dtypes each side, with NaN and ±inf (masked and not), all-masked rows,
    0-d and 1-d tensors."""
    rng = np.random.default_rng(5)
    for shape in ((), (1,), (7,), (3, 17), (4, 1025), (2, 3, 40)):
        a = -rng.random(shape) * 6.0
        b = a + rng.normal(0, 0.05, shape) * 10.0 ** rng.integers(-4, 1)
        mask = rng.random(shape) > 0.3
        if a.size >= 7:
            a.flat[a.size // 2], b.flat[a.size // 3], b.flat[1] = np.nan, np.inf, -np.inf
            mask.flat[a.size // 2] = mask.flat[a.size // 3] = True
        for da in (np.float32, np.float64):
            for db in (np.float32, np.float64):
                yield a.astype(da), b.astype(db), mask
                yield a.astype(da), b.astype(db), None


def test_the_maxima_are_those_of_the_full_reduction():
    seen_nonfinite = 0
    for a, b, mask in _pairs():
        figures, _, _ = reduce_pair(a, b, 0.2, mask)
        tokens, largest, bad = reduce_maxima(a, b, mask)
        assert (tokens, bad) == (figures.tokens, figures.nonfinite), (a.shape, a.dtype, b.dtype)
        assert np.float64(largest).tobytes() == np.float64(figures.max_abs).tobytes()
        seen_nonfinite += bad > 0
    assert seen_nonfinite >= 16  # the NaN/inf cases were there, masked


def test_shapes_that_differ_are_refused():
    with pytest.raises(ValueError, match="shapes differ"):
        reduce_maxima(np.zeros((2, 3)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="mask"):
        reduce_maxima(np.zeros((2, 3)), np.zeros((2, 3)), np.ones(5, bool))


@pytest.mark.parametrize("layout", ["rlprobe", "msprobe"])
def test_lean_rules_report_what_the_full_reduction_does(tmp_path, layout):
    path = _rlprobe_run(tmp_path / "run", True) if layout == "rlprobe" else _msprobe_run(tmp_path / "run")
    full = check_dump(path, {"on_policy_ulps": 0}, only=RULES)
    lean = check_dump(path, {"on_policy_ulps": 0}, only=RULES, maxima_only=True)
    assert lean.results.equals(full.results)
    assert lean.rows["on_policy"].equals(full.rows["on_policy"]) and lean.rows["on_policy"].num_rows > 0
    full_steps = {(r["pair"], r["step"], r["rank"]): r for r in full.tables["token_steps"].to_pylist()}
    lean_steps = lean.tables["token_steps"].to_pylist()
    assert {(r["pair"], r["step"], r["rank"]) for r in lean_steps} == set(full_steps)
    for row in lean_steps:
        whole = full_steps[(row["pair"], row["step"], row["rank"])]
        kept = ("pair", "step", "rank", "dtype_a", "dtype_b", "masked", "tokens", "nonfinite", "max_abs", "eps")
        assert {k: row[k] for k in kept} == {k: whole[k] for k in kept}
        assert row["mean_abs"] is None and whole["mean_abs"] is not None  # the figures no rule read: not computed
    assert lean.tables["token_hist"].num_rows == 0 < full.tables["token_hist"].num_rows
