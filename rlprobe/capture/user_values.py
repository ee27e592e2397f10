"""Checks and conversions of values the training code hands a Probe: whole numbers, metric values,
configurations."""

from __future__ import annotations

import math
import operator
from typing import Any

from rlprobe.errors import ProbeError


def is_whole_number(value: Any) -> bool:
    """An int (numpy integers too), not a bool or a float."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def whole(name: str, value: Any, detected: bool) -> int:
    if not is_whole_number(value):
        source = " (detected)" if detected else ""
        raise ProbeError(f"{name}={value!r}{source}: expected a whole number")
    return operator.index(value)


def key_names(name: str, value: Any) -> list[str]:
    """`value` (a list or tuple of key names, as save() writes them) as a sorted list without repeats."""
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)) \
            or not all(isinstance(k, str) and k for k in value):
        raise ProbeError(f"{name}={value!r}: expected a list of key names (non-empty strings), e.g. ['loss']")
    return sorted(set(value))


def as_number(value: Any) -> float | None:
    """`value` as a float64; None when it is no number; ProbeError when it is one float64 cannot hold."""
    if isinstance(value, (bool, int, float)):
        try:
            return float(value)
        except OverflowError:
            raise ProbeError(f"the int ({value.bit_length()} bits) is too large for a float64 "
                             "(about 1.8e308 at most)") from None
    item = getattr(value, "item", None)
    shape = getattr(value, "shape", None)
    if callable(item) and (shape is None or len(shape) == 0 or math.prod(shape) == 1):
        try:
            return as_number(item())
        except ProbeError:
            raise
        except Exception as e:  # a meta tensor, a value on a lost device: its own words
            raise ProbeError(f"cannot read the {type(value).__name__}'s value ({type(e).__name__}: {e})") from None
    return None


def jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)
