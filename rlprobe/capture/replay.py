"""Replay of a baseline's rollout: `Probe(..., replay_from=BASELINE)` and `probe.replay(data)` (docs/replay.md).

Across devices, a sampled token whose probability straddles the sampling draw flips after a few
steps, and every later key differs. A run that consumes the baseline's prompts, responses, masks
and rewards instead of its own compares its trainer side (log-probs, advantages, losses,
gradients) with the baseline's on the same tokens past that flip. The baseline is opened once, at
`Probe()`: a path that is not a dump, or a dump without tensor files for this rank (statistics
only), is refused before anything is written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlprobe.capture.user_values import is_whole_number
from rlprobe.errors import DumpReadError, ProbeError
from rlprobe.frameworks import adapter_for
from rlprobe.lake.encoding import INT_DTYPES, WIDENED_FLOATS
from rlprobe.lake.reader import open_dump


def open_replay(source: str | os.PathLike[str] | None, dump_path: Path, rank: int) -> "Replay | NoReplay":
    """The baseline `source` of the probe writing `dump_path` at `rank`; NoReplay when `source` is None."""
    if source is None:
        return NoReplay()
    if not isinstance(source, (str, os.PathLike)) or not os.fspath(source):
        raise ProbeError(f"replay_from={source!r}: expected the baseline dump's directory (str or os.PathLike), "
                         "or None (no replay)")
    return Replay(Path(source), dump_path, rank)


class NoReplay:
    """Replay off: `values` returns the live values as they are."""

    record = None

    def values(self, data: dict[str, Any], step: int, micro: dict[str, int] | int) -> dict[str, Any]:
        return data


class Replay:
    """The baseline's key-data tensors of one rank, indexed by (key, step, micro_step, index)."""

    def __init__(self, source: Path, dump_path: Path, rank: int):
        self.source, self.rank = source, rank
        where = f"replay_from={os.fspath(source)!r}"
        if source.exists() and dump_path.exists() and source.resolve() == dump_path.resolve():
            raise ProbeError(f"{where} is the probe's own dump directory; replay from the baseline's dump into "
                             "another directory")
        try:
            self.dump = open_dump(source)
            table = self.dump.arrow("key_data")
        except DumpReadError as e:
            raise ProbeError(f"{where}: the baseline cannot be replayed: {e}") from None
        if self.dump.format not in ("rlprobe", "msprobe"):
            raise ProbeError(f"{where}: a {self.dump.format} dump holds no key data to replay; give an rlprobe "
                             "(or msprobe key-data) dump saved with tensors")
        import pyarrow.compute as pc

        table = table.filter(pc.equal(table["rank"], rank))
        with_files = table.filter(pc.is_valid(table["tensor_file"])).num_rows if table.num_rows else 0
        if self.dump.manifest.get("stats_only") or not with_files:
            what = "is statistics-only (stats_only=True)" if self.dump.manifest.get("stats_only") else \
                f"holds no tensor files for rank {rank} ({table.num_rows} key-data rows of that rank)"
            raise ProbeError(f"{where}: the baseline {what}; replay needs its tensors: record the baseline with "
                             "rlprobe.Probe(stats_only=False) and key_data_dump on, on as many ranks as this run")
        self.table = table.drop_columns(["rank"])
        # the last of duplicate rows wins, as in Dump.tensor; a row is read whole only when replayed
        where_is = zip(*(table[c].to_pylist() for c in ("key", "step", "micro_step", "index")))
        self.at = {(k, s, m, i or ""): n for n, (k, s, m, i) in enumerate(where_is)}
        self.record = {"path": os.fspath(source.resolve()), "run_id": self.dump.manifest.get("run_id")}

    def values(self, data: dict[str, Any], step: int, micro: dict[str, int] | int) -> dict[str, Any]:
        """For each key of `data`, the baseline's tensor at `step`, this rank and the key's micro-step
        (`micro`: the probe's next micro-step per key, or one for every key), converted to the live value's
        type and device in the baseline's dtype."""
        if not isinstance(data, dict):
            raise ProbeError(f"rank {self.rank} step {step}: replay() takes a dict of name -> value, "
                             f"got {type(data).__name__}")
        if not isinstance(micro, dict) and (not is_whole_number(micro) or micro < 0):
            raise ProbeError(f"rank {self.rank} step {step}: replay(micro_step={micro!r}): expected a whole number "
                             ">= 0, or None (each key's next micro-step)")
        out = {}
        for key, live in data.items():
            m = micro.get(key, 0) if isinstance(micro, dict) else int(micro)
            out[key] = self.value(key, live, step, m)
        return out

    def value(self, key: str, live: Any, step: int, micro_step: int) -> Any:
        where = f"replay from {os.fspath(self.source)}: key {key!r} step {step} rank {self.rank} micro_step {micro_step}"
        adapter = None if isinstance(live, (list, tuple, dict)) or live is None else adapter_for(live)
        if adapter is None:
            raise ProbeError(f"{where}: replay() needs the live value, one tensor or array, to know the type, "
                             f"device and layout to return; got {type(live).__name__}")
        try:
            live_dtype, live_shape = adapter.dtype_name(live), tuple(getattr(live, "shape", ()))
        except ProbeError as e:
            raise ProbeError(f"{where}: {e}") from None
        i = self.at.get((key, step, micro_step, ""))
        if i is None:
            raise ProbeError(f"{where}: the baseline has no row of it; {self._saved(key, step)}")
        row = self.table.slice(i, 1).to_pylist()[0]
        if row.get("absent") or row.get("tensor_file") is None:
            saved = "as None (absent)" if row.get("absent") else "as statistics only (no tensor file)"
            raise ProbeError(f"{where}: the baseline saved it {saved}; there is no tensor to replay")
        try:
            array = self.dump.load_row_tensor(row)
        except DumpReadError as e:
            raise ProbeError(f"{where}: {e}") from None
        dtype = row.get("dtype") or _unknown_dtype(array, live_dtype)
        if _kind(dtype) != _kind(live_dtype) or array.ndim != len(live_shape):
            raise ProbeError(f"{where}: the baseline's layout does not fit the live value's: baseline {dtype} "
                             f"{list(array.shape)}, live {live_dtype} {list(live_shape)} (same dimensions and kind of "
                             "dtype expected: bool, integer or float; lengths may differ)")
        try:
            return adapter.from_host(array, dtype, live)
        except ProbeError as e:
            raise ProbeError(f"{where}: {e}") from None

    def _saved(self, key: str, step: int) -> str:
        """What the baseline does hold of `key` and at `step` on this rank, for a missing row's message."""
        steps = sorted({s for k, s, _, _ in self.at if k == key})
        micros = sorted({m for k, s, m, _ in self.at if k == key and s == step})
        if not steps:
            keys = sorted({k for k, s, _, _ in self.at if s == step})
            return f"it holds no {key!r} on rank {self.rank} at all (keys at step {step}: {', '.join(keys) or 'none'})"
        if not micros:
            return f"it holds {key!r} at step(s) {_ranges(steps)} of rank {self.rank}"
        return f"it holds {key!r} at micro_step(s) {_ranges(micros)} of step {step}"


def _kind(dtype: str) -> str:
    return "bool" if dtype == "bool" else "integer" if dtype in INT_DTYPES else "float"


def _unknown_dtype(array: Any, live: str) -> str:
    """The dtype of a baseline tensor whose row has none (msprobe stores integer tokens as float32): the live
    value's where the values convert to it exactly, else the array's own."""
    import numpy as np

    own = "bool" if array.dtype.kind == "b" else array.dtype.name
    if live in WIDENED_FLOATS or _kind(live) == _kind(own):
        return own
    with np.errstate(invalid="ignore", over="ignore"):
        exact = np.isfinite(array).all() and np.array_equal(array.astype(live).astype(array.dtype), array)
    return live if exact else own


def _ranges(values: list[int]) -> str:
    shown = ", ".join(map(str, values[:8]))
    return shown + (f", ... ({len(values)} in all)" if len(values) > 8 else "")
