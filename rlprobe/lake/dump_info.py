"""What a dump holds, for `rlprobe info` and Dump users."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlprobe.lake import msprobe_format, msprobe_scan
from rlprobe.lake.layout import PACK_SUFFIX
from rlprobe.lake.reader import Dump
from rlprobe.lake.sql_runner import records
from rlprobe.lake.unread import rlprobe_unread


def dump_info(dump: Dump) -> dict[str, Any]:
    """What `dump` holds. A stats part or config file that cannot be read is one of the
    `problems` (naming the file), and the rest is summarised without it; `unread` names every entry that is
    in no layout rlprobe reads (lake/unread.py, msprobe_format.unread_entries)."""
    import duckdb

    problems: list[str] = []
    try:
        con = dump.connect(errors=problems)
        keys, scalars, ranks = _tables(con)
    except duckdb.Error:  # a corrupt data page (its footer reads): find the part by reading them whole
        problems.clear()
        con = dump.connect(errors=problems, deep=True)
        keys, scalars, ranks = _tables(con)
    sizes = _key_bytes(con, dump, [k["key"] for k in keys])
    for k in keys:
        k["bytes"] = sizes.get(k["key"], 0)
    manifests = dump.rank_manifests
    for rank, m in manifests.items():
        if m.get("errors"):
            problems.append(f"rank {rank}: {len(m['errors'])} error(s), first: {m['errors'][0]}")
        if m.get("lost"):
            problems.append(f"rank {rank}: {len(m['lost'])} item(s) lost (see {dump.layout.rank_manifest(rank)})")
    world = dump.manifest.get("world_size")
    if world and dump.format == "rlprobe":
        missing = sorted(set(range(world)) - set(manifests))
        if missing:
            problems.append(f"ranks {missing} of world_size {world} wrote nothing")
        outside = sorted(r for r in manifests if not 0 <= r < world)
        if outside:
            problems.append(f"rank manifests {outside} are outside world_size {world}")
    if dump.format == "rlprobe":
        orphans = sorted(dump.layout.ranks_with_stats() - set(manifests))
        if orphans:
            problems.append(f"ranks {orphans} have statistics but no rank<R>.json: their rows are not shown "
                            "(rlprobe info/sql --include-uncommitted, rlprobe.open(path, include_uncommitted=True) show them)")
        incomplete = {r: m["incomplete_steps"] for r, m in manifests.items() if m.get("incomplete_steps")}
        for rank, steps in incomplete.items():
            problems.append(f"rank {rank}: steps {steps} lost rows and are not committed: their other rows are not "
                            "shown")
    run_ids = {m.get("run_id") for m in manifests.values()}
    if len(run_ids) > 1:
        problems.append(f"ranks disagree on run_id: {sorted(map(str, run_ids))}")
    ranks = sorted(manifests) or ranks
    unread = (msprobe_format.unread_entries(dump.path, msprobe_scan.list_tensors(os.fspath(dump.path)).unread)
              if dump.format == "msprobe" else rlprobe_unread(dump.path) if dump.format == "rlprobe" else [])
    return {
        "path": str(dump.path),
        "format": dump.format,
        "run_id": dump.manifest.get("run_id"),
        "framework": dump.manifest.get("framework"),
        "world_size": world,
        "ranks": ranks,
        "complete": dump.complete,
        "committed_steps": {r: len(m.get("committed_steps", [])) for r, m in manifests.items()},
        "tensor_bytes": sum(k["bytes"] for k in keys),
        "keys": keys,
        "scalars": scalars,
        "problems": problems,
        "unread": unread,  # entries of the dump rlprobe does not read (never an error)
    }


def _tables(con: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    """(keys, scalars, ranks with key data) from the views of Dump.connect."""
    ranks = sorted(r for r, in con.execute("select distinct rank from key_data").fetchall())
    return records(con, "info_key_data.sql"), records(con, "info_scalars.sql"), ranks


def _key_bytes(con: Any, dump: Dump, keys: list[str]) -> dict[str, int]:
    """Bytes of each key's tensor files: one walk of the tensor folder, joined with the rows'
    tensor_file (a key's tensors lie in every save call's packed file, docs/dump-format.md "Files")."""
    if dump.format != "rlprobe":  # msprobe: data/<key>/...
        return {k: sum(_npy_sizes(dump.path / "data" / k, dump.path).values()) for k in keys}
    import pyarrow as pa

    sizes = _npy_sizes(dump.path / "tensors" / "key_data", dump.path)
    con.register("tensor_sizes", pa.table({"path": pa.array(list(sizes), pa.string()),
                                           "size": pa.array(list(sizes.values()), pa.int64())}))
    try:
        return {r["key"]: int(r["bytes"]) for r in records(con, "info_key_bytes.sql")}
    finally:
        con.unregister("tensor_sizes")


def _npy_sizes(root: Path, base: Path) -> dict[str, int]:
    """Size of every .npy file (and packed file, lake/tensor_pack.py) under `root`, by its path relative to `base` (POSIX separators)."""
    sizes: dict[str, int] = {}
    prefix = len(os.fspath(base)) + 1
    stack = [os.fspath(root)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    if entry.name.startswith("."):  # a killed writer's temporaries
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.name.endswith((".npy", PACK_SUFFIX)):
                        sizes[entry.path[prefix:].replace(os.sep, "/")] = entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue
    return sizes
