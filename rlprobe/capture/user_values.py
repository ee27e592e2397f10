"""Checks and conversions of values the training code hands a Probe: whole numbers, metric values,
configurations.

And flatten: a save() dict of nested lists/tuples/dicts turned into (key, index, leaf) triples.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Iterator

from rlprobe.errors import ProbeError
from rlprobe.frameworks import Adapter, adapter_for
from rlprobe.lake.layout import check_name

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


EXPECTED = ("a torch or MindSpore tensor, a numpy array, a Python bool/int/float, None (not computed), "
            "or a list, tuple or dict of them")
_GOOD_KEYS: set[str] = set()  # keys check_name accepted (it has no state: a key good once is good again)
MAX_DEPTH = 32  # lists/dicts nested deeper than this are refused, not walked until Python's stack runs out


def flatten(data: Any, where: str) -> list[tuple[str, str, Any, Adapter | None]]:
    """[(key, index, leaf, adapter)] in insertion order; raises ProbeError before anything is saved.

    A None leaf (a value the trainer did not compute) comes with adapter None: it is recorded as
    a row marked absent. Two paths that flatten to one index (`{"a.b": x, "a": {"b": y}}`) are
    refused, naming both: they would share one row key and one tensor file."""
    if not isinstance(data, dict):
        raise ProbeError(f"{where}: save() takes a dict of name -> value, got {type(data).__name__}")
    out: list[tuple[str, str, Any, Adapter | None]] = []
    for key, value in data.items():
        if key not in _GOOD_KEYS:  # a training loop saves the same few keys every step
            check_name(key, "key", where)
            if len(_GOOD_KEYS) < 4096 and type(key) is str:
                _GOOD_KEYS.add(key)
        if not isinstance(value, (list, tuple, dict)):  # one value under its key (nearly every save)
            out.append(_leaf(key, "", value, where))
            continue
        at_key = f"{where}, key {key!r}"
        seen: dict[str, str] = {}  # index -> the path that produced it
        for index, path, leaf in _walk(value, "", "", at_key, (), 0):
            if index in seen:
                raise ProbeError(
                    f"{at_key}: {key}{seen[index]} and {key}{path} both become index {index!r} (nested names are "
                    "joined with '.'), so they would share one row and one tensor file; rename one of them")
            seen[index] = path
            out.append(_leaf(key, index, leaf, where))
    return out


def _leaf(key: str, index: str, leaf: Any, where: str) -> tuple[str, str, Any, Adapter | None]:
    """(key, index, leaf, its adapter), the leaf's type and dtype checked; the message names where it is."""
    if leaf is None:
        return key, index, None, None
    adapter = adapter_for(leaf)
    if adapter is None:
        raise ProbeError(f"{_at(where, key, index)}: unsupported value of type {type(leaf).__name__}; "
                         f"expected {EXPECTED}")
    try:
        adapter.dtype_name(leaf)
    except ProbeError as e:
        raise ProbeError(f"{_at(where, key, index)}: {e}") from None
    return key, index, leaf, adapter


def _at(where: str, key: str, index: str) -> str:
    return f"{where}, key {key!r}" + (f" index {index!r}" if index else "")


def _walk(value: Any, prefix: str, path: str, where: str, parents: tuple[int, ...],
          depth: int) -> Iterator[tuple[str, str, Any]]:
    """(index, path as written in Python, leaf); `parents` are the ids of the enclosing containers."""
    if isinstance(value, (list, tuple, dict)):
        at = f" index {prefix!r}" if prefix else ""
        if id(value) in parents:
            raise ProbeError(f"{where}{at}: the {type(value).__name__} contains itself; save() needs a tree of "
                             f"values, not a self-referencing one")
        if depth >= MAX_DEPTH:
            raise ProbeError(f"{where}{at}: nested more than {MAX_DEPTH} levels deep; save the inner values "
                             "under keys of their own")
        parents = (*parents, id(value))
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _walk(item, f"{prefix}.{i}" if prefix else str(i), f"{path}[{i}]", where, parents, depth + 1)
    elif isinstance(value, dict):
        for name, item in value.items():
            check_name(name, "dict key", where)
            yield from _walk(item, f"{prefix}.{name}" if prefix else name, f"{path}[{name!r}]", where, parents,
                             depth + 1)
    else:
        yield prefix, path, value


def shape_of(leaf: Any) -> tuple[int, ...] | None:
    """A leaf's shape before staging (None for an absent value, () for a Python scalar)."""
    return None if leaf is None else tuple(getattr(leaf, "shape", ()))
