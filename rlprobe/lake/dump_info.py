"""What a dump holds, for `rlprobe info` and Dump users."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlprobe.lake.layout import safe_component
from rlprobe.lake.reader import Dump
from rlprobe.lake.sql_runner import records


def dump_info(dump: Dump) -> dict[str, Any]:
    """What `dump` holds. A stats part or config file that cannot be read is one of the
    `problems` (naming the file), and the rest is summarised without it."""
    import duckdb

    problems: list[str] = []
    try:
        con = dump.connect(errors=problems)
        keys, scalars, ranks = _tables(con)
    except duckdb.Error:  # a corrupt data page (its footer reads): find the part by reading them whole
        problems.clear()
        con = dump.connect(errors=problems, deep=True)
        keys, scalars, ranks = _tables(con)
    for k in keys:
        k["bytes"] = _tree_bytes(_key_dir(dump, k["key"]))
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
                            "(rlprobe.open(path, include_uncommitted=True) shows them)")
        incomplete = {r: m["incomplete_steps"] for r, m in manifests.items() if m.get("incomplete_steps")}
        for rank, steps in incomplete.items():
            problems.append(f"rank {rank}: steps {steps} lost rows and are not committed: their other rows are not "
                            "shown")
    run_ids = {m.get("run_id") for m in manifests.values()}
    if len(run_ids) > 1:
        problems.append(f"ranks disagree on run_id: {sorted(map(str, run_ids))}")
    ranks = sorted(manifests) or ranks
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
    }


def _tables(con: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    """(keys, scalars, ranks with key data) from the views of Dump.connect."""
    ranks = sorted(r for r, in con.execute("select distinct rank from key_data").fetchall())
    return records(con, "info_key_data.sql"), records(con, "info_scalars.sql"), ranks


def _key_dir(dump: Dump, key: str) -> Path:
    if dump.format == "rlprobe":
        return dump.path / "tensors" / "key_data" / f"key={safe_component(key)}"
    return dump.path / "data" / key


def _tree_bytes(root: Path) -> int:
    total = 0
    stack = [root]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.name.endswith(".npy"):
                        total += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue
    return total
