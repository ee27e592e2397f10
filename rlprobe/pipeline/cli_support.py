"""The console side of `rlprobe pipeline validate|run` and `rlprobe history`: messages and exit codes."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rlprobe.pipeline.spec import SpecError, load_pipeline


def _error(console: Console, message: str) -> None:
    console.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def validate_command(file: str, overrides: tuple[str, ...]) -> int:
    err = Console(stderr=True)
    try:
        p = load_pipeline(file, overrides)
    except SpecError as e:
        _error(err, str(e))
        return e.exit_code
    (a, path_a), (b, path_b) = p.runs.items()
    Console().print(f"[green]ok[/]: {escape(file)}: pipeline {escape(p.spec.name)}, {a}={escape(str(path_a))} (A) vs "
                    f"{b}={escape(str(path_b))} (B), {len(p.queries)} queries, {len(p.gates)} gates, "
                    f"output {escape(str(p.output))}", highlight=False, soft_wrap=True)
    return 0


def run_command(file: str, overrides: tuple[str, ...], *, dry_run: bool, quiet: bool) -> int:
    from rlprobe.pipeline.runner import PipelineError, run_pipeline

    err, out = Console(stderr=True), Console()
    try:
        p = load_pipeline(file, overrides)
    except SpecError as e:
        _error(err, str(e))
        return e.exit_code
    if dry_run:
        spec = p.spec
        out.print(f"pipeline {spec.name} ({file}), dry run: nothing compared, nothing written", highlight=False)
        for i, (name, path) in enumerate(p.runs.items()):
            out.print(f"  run {'AB'[i]}: {name} = {path}", highlight=False)
        out.print(f"  select: steps {spec.select.steps or 'all'}, ranks {spec.select.ranks or 'all'}, "
                  f"keys {spec.select.keys or 'all'}; executor {spec.executor.kind} ({spec.executor.workers} workers)",
                  highlight=False)
        for q in p.queries:
            out.print(f"  query {q.name}: {q.origin}", highlight=False)
        for g in p.gates:
            out.print(f"  gate {g.name}: {g.origin}", highlight=False)
        out.print(f"  output: {p.output}" + (f"; history: {p.history}" if p.history else ""), highlight=False)
        return 0
    try:
        result = run_pipeline(p)
    except PipelineError as e:
        _error(err, str(e))
        return e.exit_code
    first = result.summary.get("first_divergence")
    if first:
        out.print(f"first divergence: {first['key']} at step {first['step']}, rank {first['rank']}, "
                  f"micro_step {first['micro_step']}: {first['status']}", highlight=False)
    else:
        out.print("no divergence in key data", highlight=False)
    for g in result.gates:
        mark = "[green]pass[/]" if g.passed else f"[red]FAIL[/] ({g.rows.num_rows} rows)"
        out.print(f"gate {escape(g.name)}: {mark}", highlight=False)
    out.print(f"report: {escape(str(result.output))}", highlight=False, soft_wrap=True)
    return result.exit_code


def history_command(file: str, plots_dir: str | None, no_plots: bool, last: int) -> int:
    from rich.table import Table

    from rlprobe.pipeline.history import HistoryError, history_overview, read_history, write_history_plots

    err, out = Console(stderr=True), Console()
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
    view = Table(title=f"{path} ({len(runs)} runs)", title_justify="left")
    for column in ("run", "when (UTC)", "pipeline", "first divergence", "worst max rel err", "diverging rows",
                   "grad similarity", "gates passed"):
        view.add_column(column)
    for r in runs[-last:]:
        first = "-" if r["first_divergence_step"] is None else f"step {int(r['first_divergence_step'])} {r['first_divergence_key']}"
        view.add_row(r["run_id"], r["created_at"].strftime("%Y-%m-%d %H:%M") if r["created_at"] else "-",
                     r["pipeline"] or "-", first, _num(r["worst_max_rel_err"]), _num(r["diverging_rows"], "{:.0f}"),
                     _num(r["grad_weighted_similarity"], "{:.4f}"),
                     f"{int(r['gates_passed'] or 0)}/{r['gates']}" if r["gates"] else "-")
    out.print(view)
    if not no_plots:
        target = Path(plots_dir) if plots_dir else path.with_name(f"{path.stem}_plots")
        try:
            written = write_history_plots(table, target)
        except OSError as e:
            _error(err, f"plots folder {target} cannot be written: {e.strerror or e}")
            return 3
        out.print(f"plots: {target} ({len(written)} files)", highlight=False)
    return 0


def _num(value: float | None, fmt: str = "{:.3g}") -> str:
    return "-" if value is None else fmt.format(value)
