"""The console side of `rlprobe pipeline validate|run`, `rlprobe history` and `rlprobe sql`: messages and exit codes.

`rlprobe sql --run name=path` puts many dumps and comparison results in one DuckDB connection; `rlprobe sql
OUT` and `rlprobe info OUT` read a result directory alone (`connect_result_dir`, `result_views`). Each run
becomes a schema: a dump gives `name.key_data`, `name.scalars`, `name.configs`; a comparison or pipeline
output directory gives one view per Parquet file (`name.key_data`, `name.scalars`, `name.queries_<query>`,
`name.gates_<gate>`). Every table name found in any run is also in the main schema as `all_<table>`, the runs
stacked with a `run` column.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from rlprobe.console import make_console, print_table, whole
from rlprobe.errors import DumpReadError, ProbeError
from rlprobe.pipeline.spec import Pipeline, SpecError, load_pipeline

def _error(console: Console, message: str) -> None:
    console.print(f"[red]error:[/] {escape(message)}", highlight=False)


def validate_command(file: str, overrides: tuple[str, ...]) -> int:
    err = make_console(stderr=True)
    try:
        p = load_pipeline(file, overrides)
    except SpecError as e:
        _error(err, str(e))
        return e.exit_code
    named = [whole(f"{name}={path}") for name, path in p.compared.items()]
    runs = f"{named[0]} (A) vs {named[1]} (B)" if len(named) == 2 else f"{named[0]} (checked alone)"
    if p.control is not None:
        runs += f", control run {whole(str(p.control))}"
    queries, gates = f"{len(p.queries)} queries", f"{len(p.gates)} gates"
    make_console().print(f"[green]ok[/]: {whole(file)}: pipeline {whole(p.spec.name)}, {runs}, {whole(queries)}, "
                         f"{whole(gates)}, output {whole(p.output)}", highlight=False)
    return 0


def run_command(file: str, overrides: tuple[str, ...], *, dry_run: bool, quiet: bool) -> int:
    from rlprobe.pipeline.runner import PipelineError, run_pipeline

    err, out = make_console(stderr=True), make_console()
    try:
        p = load_pipeline(file, overrides)
    except SpecError as e:
        _error(err, str(e))
        return e.exit_code
    if dry_run:
        _print_dry_run(out, p, file)
        return 0
    try:
        result = run_pipeline(p)
    except PipelineError as e:
        _error(err, str(e))
        return e.exit_code
    first = result.summary.get("first_divergence")
    if first:
        where = ", ".join(whole(f"{field} {first[field]}") for field in ("step", "rank", "micro_step"))
        out.print(f"first divergence: {whole(first['key'])} at {where}: {escape(str(first['status']))}",
                  highlight=False)
    elif result.summary.get("compared") == []:
        out.print("nothing compared: neither run holds key data, gradients, module dumps or parameter fingerprints",
                  highlight=False)
    else:
        out.print("no divergence in key data", highlight=False)
    from rlprobe.report.markdown import console_lines

    for line in console_lines(result.summary):  # issue 14: the config diff and warnings
        out.print(escape(line), highlight=False)
    for g in result.gates:
        mark = "[green]pass[/]" if g.passed else f"[red]FAIL[/] {whole(f'({g.rows.num_rows} rows)')}"
        out.print(f"gate {whole(g.name)}: {mark}", highlight=False)
    out.print(f"report: {whole(result.output)}", highlight=False)
    return result.exit_code


def _print_dry_run(out: Console, p: Pipeline, file: str) -> None:
    spec = p.spec
    out.print(f"pipeline {whole(spec.name)} ({whole(file)}), dry run: nothing compared, nothing written",
              highlight=False)
    for i, (name, path) in enumerate(p.compared.items()):
        out.print(f"  run {'AB'[i]}: {whole(name)} = {whole(path)}", highlight=False)
    if p.control is not None:
        out.print(f"  control run: {whole(str(p.control))}", highlight=False)
    select = spec.select
    workers = f"({spec.executor.workers} workers)"
    out.print(f"  select: steps {whole(select.steps or 'all')}, ranks {whole(select.ranks or 'all')}, "
              f"keys {whole(select.keys or 'all')}; executor {whole(spec.executor.kind)} {whole(workers)}",
              highlight=False)
    for q in p.queries:
        out.print(f"  query {whole(q.name)}: {whole(q.origin)}", highlight=False)
    for g in p.gates:
        out.print(f"  gate {whole(g.name)}: {whole(g.origin)}", highlight=False)
    history = f"; history: {whole(p.history)}" if p.history else ""
    out.print(f"  output: {whole(p.output)}{history}", highlight=False)


def history_command(file: str, plots_dir: str | None, no_plots: bool, last: int) -> int:
    from rlprobe.pipeline.history import HistoryError, history_overview, read_history, write_history_plots

    err, out = make_console(stderr=True), make_console()
    path = Path(file)
    if not path.exists():
        _error(err, f"history file {path} does not exist (a pipeline with `history: {path}` creates it)")
        return 3
    try:
        table = read_history(path)
    except HistoryError as e:
        _error(err, str(e))
        return 3
    runs = history_overview(table)
    rows = []
    for r in runs[-last:]:
        first = "-" if r["first_divergence_step"] is None else f"step {int(r['first_divergence_step'])} {r['first_divergence_key']}"
        rows.append([r["run_id"], r["created_at"].strftime("%Y-%m-%d %H:%M") if r["created_at"] else "-",
                     r["pipeline"] or "-", first, _num(r["worst_max_rel_err"]), _num(r["diverging_rows"], "{:.0f}"),
                     _num(r["grad_weighted_similarity"], "{:.4f}"),
                     f"{int(r['gates_passed'] or 0)}/{r['gates']}" if r["gates"] else "-"])
    runs_count = f"({len(runs)} runs)"
    print_table(out, ["run", "when (UTC)", "pipeline", "first divergence", "worst max rel err", "diverging rows",
                      "grad similarity", "gates passed"], rows, title=f"{whole(path)} {whole(runs_count)}")
    if not no_plots:
        target = Path(plots_dir) if plots_dir else path.with_name(f"{path.stem}_plots")
        try:
            written = write_history_plots(table, target)
        except OSError as e:
            _error(err, f"plots folder {target} cannot be written: {e.strerror or e}")
            return 3
        files = f"({len(written)} files)"
        out.print(f"plots: {whole(target)} {whole(files)}", highlight=False)
    return 0


def _num(value: float | None, fmt: str = "{:.3g}") -> str:
    return "-" if value is None else fmt.format(value)


def result_info(root: Path) -> dict[str, Any]:
    """The summary of the result folder `root` (is_result_dir); DumpReadError names a file that cannot be read."""
    import pyarrow.parquet as pq

    try:
        summary = json.loads((root / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DumpReadError(f"{root / 'summary.json'}: unreadable ({e})") from None
    if not isinstance(summary, dict):
        raise DumpReadError(f"{root / 'summary.json'}: not a JSON object")
    tables = []
    for view, f in result_views(root):
        try:
            rows = pq.ParquetFile(f).metadata.num_rows
        except Exception as e:  # pyarrow's OSError or ArrowException: a corrupt file
            raise DumpReadError(f"{f}: unreadable Parquet file ({' '.join(str(e).split())})") from None
        tables.append({"table": view, "file": f.relative_to(root).as_posix(), "rows": rows})
    pipeline = summary.get("pipeline") or {}
    return {
        "path": str(root),
        "kind": "comparison",
        "pipeline": pipeline.get("name"),
        "rlprobe_version": summary.get("rlprobe_version"),
        "created_at": summary.get("created_at"),
        "runs": {side: {"path": summary.get(f"run_{side}"), "format": summary.get(f"format_{side}")}
                 for side in ("a", "b") if summary.get(f"run_{side}")},
        "compared": summary.get("compared"),
        "first_divergence": summary.get("first_divergence"),
        "suspect": summary.get("suspect"),
        "advice": summary.get("advice"),
        "counts": summary.get("counts") or {},
        "gates": [{"name": g.get("name"), "passed": g.get("passed"), "rows": g.get("rows")}
                  for g in summary.get("gates") or []],
        "tables": tables,
    }


IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_run_option(value: str) -> tuple[str, str]:
    """'baseline=./dumps/a' -> ('baseline', './dumps/a')."""
    name, sep, path = value.partition("=")
    name = name.strip()
    if not sep or not path.strip():
        raise ProbeError(f"--run {value!r}: expected NAME=PATH, e.g. --run a=./dumps/a")
    if not IDENTIFIER.match(name):
        raise ProbeError(f"--run {value!r}: the name {name!r} must be a SQL identifier (letters, digits, _)")
    return name, path.strip()


def is_result_dir(path: Path) -> bool:
    """A directory written by `rlprobe compare` or `rlprobe pipeline run`."""
    return path.is_dir() and (path / "key_data.parquet").is_file() and (path / "summary.json").is_file()


def attach_runs(runs: list[tuple[str, str]], con: Any = None, include_uncommitted: bool = False) -> Any:
    """A DuckDB connection with one schema per run and the stacked all_<table> views (dumps read with
    `include_uncommitted` as rlprobe.open reads them)."""
    import duckdb

    con = con or duckdb.connect()
    seen: dict[str, list[str]] = {}
    names = [n for n, _ in runs]
    if len(set(names)) != len(names):
        raise ProbeError(f"--run names must differ; got {names}")
    for name, path in runs:
        root = Path(path)
        if is_result_dir(root):
            views = _attach_result_dir(con, name, root)
        else:
            from rlprobe.lake.reader import open_dump

            open_dump(root, include_uncommitted).connect(con, schema=name)  # DumpReadError names the path
            views = ["key_data", "scalars", "configs"]
        for view in views:
            seen.setdefault(view, []).append(name)
    for view, owners in seen.items():
        parts = [f"SELECT '{owner}' AS run, * FROM \"{owner}\".\"{view}\"" for owner in owners]
        con.execute(f'CREATE OR REPLACE VIEW "all_{view}" AS ' + " UNION ALL BY NAME ".join(parts))
    return con


def check_every_file(paths: list[str]) -> None:
    """Read whole every Parquet file behind the views of the runs at `paths` (dumps and result
    directories); DumpReadError names the first that cannot be read. For a query that failed on
    a corrupt data page, which DuckDB reports without the file (slow: every page is read)."""
    import pyarrow.parquet as pq

    from rlprobe.lake.parts import unreadable_part
    from rlprobe.lake.reader import open_dump

    for path in paths:
        root = Path(path)
        if not is_result_dir(root):
            open_dump(root).check_every_page()
            continue
        for f in _result_files(root):
            try:
                pq.read_table(f)
            except Exception as e:  # pyarrow's OSError or ArrowException: a corrupt file
                raise DumpReadError(unreadable_part(f, e)) from None


def _result_files(root: Path) -> list[Path]:
    return sorted(root.glob("*.parquet")) + sorted(root.glob("queries/*.parquet")) + sorted(root.glob("gates/*.parquet"))


def result_views(root: Path) -> list[tuple[str, Path]]:
    """The views of a result directory, (name, Parquet file): key_data, queries_<q>, gates_<g>, ..."""
    named = [(f.stem if f.parent == root else f"{f.parent.name}_{f.stem}", f) for f in _result_files(root)]
    return [(view, f) for view, f in named if IDENTIFIER.match(view)]


def connect_result_dir(root: Path, con: Any = None) -> Any:
    """A DuckDB connection whose main schema has the result directory's views, as `rlprobe sql OUT` reads it."""
    import duckdb

    con = con or duckdb.connect()
    _create_views(con, root)
    return con


def _attach_result_dir(con: Any, name: str, root: Path) -> list[str]:
    database, previous = con.sql("SELECT current_database(), current_schema()").fetchall()[0]
    con.execute(f'CREATE SCHEMA IF NOT EXISTS "{database}"."{name}"')
    con.execute(f'USE "{database}"."{name}"')
    try:
        return _create_views(con, root)
    finally:
        con.execute(f'USE "{database}"."{previous}"')


def _create_views(con: Any, root: Path) -> list[str]:
    views = []
    for view, f in result_views(root):
        try:
            con.read_parquet(str(f)).create_view(view, replace=True)
        except Exception as e:  # duckdb.Error: an unreadable file
            raise DumpReadError(f"{f}: unreadable Parquet file ({e})") from None
        views.append(view)
    return views
