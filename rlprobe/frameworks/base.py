"""What every framework adapter answers: is it a tensor, which rank, stats and host copies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np


@dataclass
class StagedLeaf:
    """One tensor on its way to the writer.

    `raw` holds the original bytes in a storage dtype (see lake.encoding), or is None in
    stats-only mode when the tensor never left its device. `device_stats` is filled when the
    statistics were computed on the device; the writer computes them on the host otherwise.
    `finish` (if set) blocks until asynchronous device-to-host copies have landed and then
    fills `raw` and `device_stats`; the writer calls it before touching either.
    """

    dtype: str
    shape: tuple[int, ...]
    raw: np.ndarray | None
    device_stats: dict[str, float | int | None] | None = None
    finish: Callable[[], None] | None = None
    release: Callable[[], None] | None = None  # the writer calls it when done with `raw`
    nbytes: int = 0


class Adapter(Protocol):
    name: str

    def is_tensor(self, value: Any) -> bool: ...

    def dtype_name(self, value: Any) -> str: ...

    def stage(self, values: Sequence[Any], keep_raw: bool) -> list[StagedLeaf]:
        """Snapshot `values` (one save call) so later in-place changes cannot alter what is saved."""
        ...

    def rank_and_world(self) -> tuple[int, int] | None: ...
