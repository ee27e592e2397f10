"""Turn a save() dict of nested lists/tuples/dicts into (key, index, leaf) triples."""

from __future__ import annotations

from typing import Any, Iterator

from rlprobe.errors import ProbeError
from rlprobe.frameworks import Adapter, adapter_for
from rlprobe.lake.layout import check_name

EXPECTED = ("a torch or MindSpore tensor, a numpy array, a Python bool/int/float, "
            "or a list, tuple or dict of them")


def flatten(data: Any, where: str) -> list[tuple[str, str, Any, Adapter]]:
    """[(key, index, leaf, adapter)] in insertion order; raises ProbeError before anything is saved."""
    if not isinstance(data, dict):
        raise ProbeError(f"{where}: save() takes a dict of name -> value, got {type(data).__name__}")
    out: list[tuple[str, str, Any, Adapter]] = []
    for key, value in data.items():
        check_name(key, "key", where)
        for index, leaf in _walk(value, "", f"{where}, key {key!r}"):
            adapter = adapter_for(leaf)
            if adapter is None:
                at = f" index {index!r}" if index else ""
                raise ProbeError(
                    f"{where}, key {key!r}{at}: unsupported value of type {type(leaf).__name__}; expected {EXPECTED}"
                )
            try:
                adapter.dtype_name(leaf)
            except ProbeError as e:
                at = f" index {index!r}" if index else ""
                raise ProbeError(f"{where}, key {key!r}{at}: {e}") from None
            out.append((key, index, leaf, adapter))
    return out


def _walk(value: Any, prefix: str, where: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _walk(item, f"{prefix}.{i}" if prefix else str(i), where)
    elif isinstance(value, dict):
        for name, item in value.items():
            check_name(name, "dict key", where)
            yield from _walk(item, f"{prefix}.{name}" if prefix else name, where)
    else:
        yield prefix, value
