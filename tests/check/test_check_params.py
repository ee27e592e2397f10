"""checks/registry.py, check_params: what each check parameter takes, numpy's scalars included (rlprobe.check(dump, **params))."""

from __future__ import annotations

import numpy as np
import pytest

from rlprobe.checks.registry import check_params


def test_numpy_scalars_are_numbers_and_whole_numbers_must_be_whole():
    check_params({"group_size": np.int64(4), "eps": np.float32(0.2), "max_abs_delta": float("inf"), "workers": 2,
                  "ref_starts_as_actor": False, "generation_every": None})
    for params, said in (({"group_size": 2.0}, "group_size=2.0: expected a whole number >= 1"),
                         ({"workers": True}, "workers=True: expected a whole number >= 1"),
                         ({"eps": float("nan")}, "eps=nan: expected a number >= 0"),
                         ({"kl_floor": -0.0001}, "kl_floor=-0.0001: expected a number >= 0"),
                         ({"ref_starts_as_actor": 1}, "ref_starts_as_actor=1: expected true or false")):
        with pytest.raises(ValueError, match=f"check parameter {said}"):
            check_params(params)
