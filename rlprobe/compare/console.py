"""The console side of `rlprobe compare`: progress bar, verdict, exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from rlprobe.console import make_console, whole
from rlprobe.errors import DumpReadError, ProbeError

EXIT_OK, EXIT_DIVERGED, EXIT_USAGE, EXIT_UNREADABLE = 0, 1, 2, 3


def run_compare(run_a: str, run_b: str, out: str, *, fail_on_diff: bool, quiet: bool, plots: bool,
                plot_every_param: bool = False, **options: Any) -> int:
    from rlprobe.compare.run import compare

    console = make_console(stderr=True)
    progress_bar = None
    callback = None
    if not quiet:
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

        progress_bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), TimeRemainingColumn(), console=console, transient=True)
        task = progress_bar.add_task("comparing tensors", total=None)

        def callback(done: int, total: int) -> None:
            progress_bar.update(task, completed=done, total=total)

        progress_bar.start()
    try:
        summary = compare(run_a, run_b, out, progress=callback, **options)
    except (DumpReadError, ProbeError) as e:
        console.print(f"[red]error:[/] {escape(str(e))}")
        return EXIT_UNREADABLE
    finally:
        if progress_bar is not None:
            progress_bar.stop()
    plot_error = None
    if plots or plot_every_param:
        from rlprobe.report.plots import write_plots

        try:
            write_plots(out, every_param=plot_every_param)
        except OSError as e:  # the comparison's files are written already and stay
            plot_error = f"the plots cannot be written in {Path(out) / 'plots'}: {e}"
    print_verdict(make_console(), summary, out)
    if plot_error:
        console.print(f"[red]error:[/] {escape(plot_error)}")
        return EXIT_UNREADABLE
    from rlprobe.report.summary_text import differs

    return EXIT_DIVERGED if differs(summary) and fail_on_diff else EXIT_OK


def print_verdict(console: Console, summary: dict[str, Any], out: str) -> None:
    counts = ", ".join(whole(f"{n} {status}") for status, n in sorted(summary["counts"].items())) or "no key data"
    console.print(f"compared {whole(summary['run_a'])} (A) with {whole(summary['run_b'])} (B): {counts}")
    if (summary.get("layout") or {}).get("note"):  # runs with different layouts: docs/compare.md
        console.print(f"[yellow]note[/]: {escape(str(summary['layout']['note']))}")
    first = summary["first_divergence"]
    if first is None and (summary.get("module_first_divergence") or summary.get("grad_first_flagged")):
        from rlprobe.report.summary_text import verdict

        console.print(f"[bold red]{escape(verdict(summary))}[/]")
        console.print(f"[bold]suspect[/]: {escape(str(summary['suspect']))}")
        console.print(f"[bold]next[/]: {escape(str(summary['advice']))}")
    elif first is None:
        console.print("[green]no divergence[/]: every compared value agrees")
    else:
        where = [whole(f"{field} {first[field]}") for field in ("step", "rank", "micro_step")]
        if first["index"]:
            where.append(whole(f"index {first['index']!r}"))
        errs = ""
        if first.get("max_abs_err") is not None:
            abs_err, rel_err = f"max abs err {first['max_abs_err']:.3g}", f"max rel err {first['max_rel_err']:.3g}"
            errs = f" ({whole(abs_err)}, {whole(rel_err)})"
        console.print(f"[bold red]first divergence[/]: {whole(first['key'])} at {', '.join(where)}: "
                      f"{escape(str(first['status']))}{errs}")
        console.print(f"[bold]suspect[/]: {escape(str(summary['suspect']))}")
        console.print(f"[bold]next[/]: {escape(str(summary['advice']))}")
    for err in summary.get("read_errors", []):
        console.print(f"[yellow]warning[/]: {escape(str(err))}")
    from rlprobe.report.config_diff_report import console_lines

    for line in console_lines(summary):  # issue 14: the config diff and warnings
        console.print(escape(line), highlight=False)
    reports = ", ".join(whole(f"{out}/{name}") for name in ("report.xlsx", "summary.md", "key_data.parquet"))
    console.print(f"report: {reports}")
