"""The console side of `rlprobe compare`: progress bar, verdict, exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from rlprobe.errors import DumpReadError, ProbeError

EXIT_OK, EXIT_DIVERGED, EXIT_USAGE, EXIT_UNREADABLE = 0, 1, 2, 3


def run_compare(run_a: str, run_b: str, out: str, *, fail_on_diff: bool, quiet: bool, plots: bool,
                plot_every_param: bool = False, **options: Any) -> int:
    from rlprobe.compare.run import compare

    console = Console(stderr=True)
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
    except DumpReadError as e:
        console.print(f"[red]error:[/] {e}")
        return EXIT_UNREADABLE
    except ProbeError as e:
        console.print(f"[red]error:[/] {e}")
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
    print_verdict(Console(), summary, out)
    if plot_error:
        console.print(f"[red]error:[/] {plot_error}")
        return EXIT_UNREADABLE
    from rlprobe.report.summary_text import differs

    return EXIT_DIVERGED if differs(summary) and fail_on_diff else EXIT_OK


def print_verdict(console: Console, summary: dict[str, Any], out: str) -> None:
    counts = ", ".join(f"{n} {status}" for status, n in sorted(summary["counts"].items())) or "no key data"
    console.print(f"compared {summary['run_a']} (A) with {summary['run_b']} (B): {counts}")
    first = summary["first_divergence"]
    if first is None and (summary.get("module_first_divergence") or summary.get("grad_first_flagged")):
        from rlprobe.report.summary_text import verdict

        console.print(f"[bold red]{escape(verdict(summary))}[/]")
        console.print(f"[bold]suspect[/]: {escape(str(summary['suspect']))}")
        console.print(f"[bold]next[/]: {escape(str(summary['advice']))}")
    elif first is None:
        console.print("[green]no divergence[/]: every compared value agrees")
    else:
        index = f" index {first['index']!r}" if first["index"] else ""
        errs = ""
        if first.get("max_abs_err") is not None:
            errs = f" (max abs err {first['max_abs_err']:.3g}, max rel err {first['max_rel_err']:.3g})"
        console.print(f"[bold red]first divergence[/]: {first['key']} at step {first['step']}, rank {first['rank']}, "
                      f"micro_step {first['micro_step']}{index}: {first['status']}{errs}")
        console.print(f"[bold]suspect[/]: {summary['suspect']}")
        console.print(f"[bold]next[/]: {summary['advice']}")
    for err in summary.get("read_errors", []):
        console.print(f"[yellow]warning[/]: {err}")
    console.print(f"report: {out}/report.xlsx, {out}/summary.md, {out}/key_data.parquet")
