"""Step/rank selections (rlprobe/selection.py): the forms, and the bound on their size."""

from __future__ import annotations

import pytest

from rlprobe.selection import MAX_SELECTED, parse_int_set


def test_forms():
    assert parse_int_set("0-3,7") == [0, 1, 2, 3, 7]
    assert parse_int_set([5, "1-2"]) == [1, 2, 5]
    assert parse_int_set(None) is None and parse_int_set("all") is None and parse_int_set(3) == [3]
    with pytest.raises(ValueError, match="steps: '3-1' is not a number or a range"):
        parse_int_set("3-1")


def test_a_selection_larger_than_the_bound_is_refused_before_it_is_made():
    """"0-99999999999" (a way to say "from 0 on") made a list of 1e11 numbers: memory and time without end."""
    assert len(parse_int_set(f"0-{MAX_SELECTED - 1}")) == MAX_SELECTED
    with pytest.raises(ValueError, match=r"--steps: '0-99999999999' makes a selection of more than 1,000,000"):
        parse_int_set("0-99999999999", "--steps")
    assert len(parse_int_set(f"0-{MAX_SELECTED - 3},5-10", "ranks")) == MAX_SELECTED - 2  # overlaps count once
    with pytest.raises(ValueError, match=r"ranks: '\d+' makes a selection of more than"):
        parse_int_set(f"0-{MAX_SELECTED - 1},{MAX_SELECTED}", "ranks")  # the items together
