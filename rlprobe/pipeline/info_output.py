"""The console side of `rlprobe info` (a dump's summary as tables) and `rlprobe sql` (a query's result
as a table, CSV, JSON or Parquet).

dump_info says what a dump holds, for `rlprobe info` and Dump users.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from rlprobe.lake import msprobe_format, msprobe_scan
from rlprobe.lake.layout import PACK_SUFFIX
from rlprobe.lake.msprobe_format import rlprobe_unread
from rlprobe.lake.reader import Dump
from rlprobe.lake.sql_runner import records

def print_dump_summary(s: dict[str, Any]) -> None:
    from rich.markup import escape

    from rlprobe.console import make_console, print_table, whole

    console = make_console()
    complete = {True: "[green]complete[/]", False: "[yellow]incomplete (killed, or still running)[/]",
                None: "unknown (msprobe dump)"}[s["complete"]]
    console.print("  ".join([f"[bold]{whole(s['path'])}[/]", whole(f"format {s['format']}"),
                             whole(f"run_id {s.get('run_id') or '-'}"), complete]))
    console.print("  ".join(whole(f"{name} {value}") for name, value in (
        ("ranks", s["ranks"]), ("world_size", s.get("world_size") or "-"), ("framework", s.get("framework") or "-"),
        ("tensor bytes", _bytes(s["tensor_bytes"])))))
    for problem in s["problems"]:
        console.print(f"[red]! {escape(str(problem))}[/]")
    rows = []
    for k in s["keys"]:
        steps = f"{k['first_step']}-{k['last_step']} ({k['steps']})" if k["steps"] > 1 else str(k["first_step"])
        rows.append([k["key"], k["dtypes"], steps, k["ranks"], k["micro_steps"], k["indexes"], k["tensors"],
                     k["tensor_files"], _bytes(k["bytes"])])
    print_table(console, ["key", "dtypes", "steps", "ranks", "micro steps", "indexes", "tensors", "saved", "bytes"],
                rows, title="[italic]key data[/]")
    if s.get("unread"):
        print_table(console, ["path (relative to the dump)"], [[path] for path in s["unread"]],
                    title=f"[italic]not read ({len(s['unread'])}: in no layout rlprobe reads)[/]")
    if s["scalars"]:
        print_table(console, ["name", "steps", "ranks", "mean"],
                    [[m["name"], f"{m['first_step']}-{m['last_step']} ({m['steps']})", m["ranks"],
                      f"{m['mean_value']:.6g}"] for m in s["scalars"]], title="[italic]scalars[/]")


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def write_table(table: Any, fmt: str, output: str | None, max_rows: int) -> None:
    """`table` as `fmt` (table, csv, json, parquet) to stdout, or written whole to the file `output` through a
    temporary file beside it (ProbeError naming it when it cannot be written; no half-written file is left)."""
    if output is None:
        _render(table, fmt, None, max_rows)
        return
    from rlprobe.report.output_folder import write_report_file

    write_report_file(output, lambda f: _render(table, fmt, f, max_rows))


def _render(table: Any, fmt: str, sink: Any, max_rows: int) -> None:
    """Write `table` as `fmt` to the binary file `sink` (None: stdout)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, sink)
    elif fmt == "csv":
        import pyarrow.csv as pacsv

        from rlprobe.report.csv_report import csv_safe_table

        pacsv.write_csv(csv_safe_table(table), sink or sys.stdout.buffer)  # formula-like text guarded, lists as text
    elif fmt == "json":
        import json

        text = json.dumps(table.to_pylist(), default=str, indent=1)
        sink.write((text + "\n").encode("utf-8")) if sink else click.echo(text)
    else:
        import io

        from rlprobe.console import make_console, print_table

        file = io.TextIOWrapper(sink, encoding="utf-8") if sink else None
        console = make_console(file=file) if file else make_console()
        shown = table.slice(0, max_rows)
        rows = zip(*(["NULL" if v is None else v for v in column.to_pylist()] for column in shown.columns))
        print_table(console, table.column_names, rows)
        if table.num_rows > max_rows:
            console.print(f"({table.num_rows} rows, {max_rows} shown; --max-rows or --format csv for all)",
                          highlight=False)
        if file:
            file.flush()
            file.detach()  # the sink stays open: write_report_file closes it


def print_result_summary(s: dict[str, Any]) -> None:
    """`rlprobe info OUT` on a comparison's or pipeline's output folder (pipeline/result_info.py)."""
    from rich.markup import escape

    from rlprobe.console import make_console, print_table, whole

    console = make_console()
    made_by = f"pipeline {s['pipeline']}" if s["pipeline"] else "rlprobe compare"
    console.print("  ".join([f"[bold]{whole(s['path'])}[/]", whole(f"comparison ({made_by})"),
                             whole(f"rlprobe {s['rlprobe_version'] or '-'}"), whole(s["created_at"] or "-")]))
    for side, run in s["runs"].items():
        fmt = f"({run['format']})"
        console.print(f"run {side.upper()}: {whole(run['path'])} {whole(fmt)}", highlight=False)
    first = s["first_divergence"]
    if first and first.get("key") is not None:
        where = ", ".join(whole(f"{field} {first.get(field)}") for field in ("step", "rank", "micro_step"))
        console.print(f"first divergence: {whole(first['key'])} at {where}: {escape(str(first.get('status')))}",
                      highlight=False)
    elif s["counts"]:
        console.print("no divergence in key data", highlight=False)
    for label in ("suspect", "advice"):
        if s[label]:
            console.print(f"{label}: {escape(str(s[label]))}", highlight=False)
    if s["counts"]:
        console.print("counts: " + ", ".join(whole(f"{status} {n}") for status, n in s["counts"].items()),
                      highlight=False)
    for g in s["gates"]:
        rows = f"({g['rows']} rows)"
        mark = "[green]pass[/]" if g["passed"] else f"[red]FAIL[/] {whole(rows)}"
        console.print(f"gate {whole(g['name'])}: {mark}", highlight=False)
    print_table(console, ["table", "rows", "file"], [[t["table"], t["rows"], t["file"]] for t in s["tables"]],
                title="[italic]tables (rlprobe sql OUT, rlprobe sql --run NAME=OUT)[/]")


def dump_info(dump: Dump) -> dict[str, Any]:
    """What `dump` holds. A stats part or config file that cannot be read is one of the
    `problems` (naming the file), and the rest is summarised without it; `unread` names every entry that is
    in no layout rlprobe reads (msprobe_format.warn_unread and unread_entries)."""
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
