"""`rlprobe compare A B -o OUT` (and `rlprobe.compare(a, b, out)`): compare two runs, write every
output file into a work folder beside OUT and swap it in (rlprobe.report.output_folder), then
print the verdict. Exit codes: 0, or 1 on a divergence with --fail-on-diff; 3 a run that cannot
be read or an output that cannot be written."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.markup import escape

from rlprobe.console import make_console, whole
from rlprobe.errors import (DumpReadError, EXIT_DIVERGED, EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE, ProbeError,
    SelectionError)

Progress = Callable[[int, int], None]


def compare(
    a: Any, b: Any, out: Any, *,
    keys: str | list[str] | None = None, steps: str | int | list[int | str] | None = None,
    ranks: str | int | list[int | str] | None = None,
    workers: int = 2, lang: str = "en", per_key_files: bool = False, per_key_dir: str = "per_key",
    tolerance: Any = None, rtol: float | None = None, atol: float | None = None, stats_rtol: float | None = None,
    order: list[str] | None = None, reports: bool = True,
    plots: bool = False, plot_every_param: bool = False, progress: Progress | None = None,
    extra_files: Callable[[Path], None] | None = None,
    key_map: dict[str, str] | None = None, config_ignore: list[str] | None = None, config_ignore_defaults: bool = True,
    control: Any = None, options: Any = None, runtime: Any = None,
) -> dict[str, Any]:
    """Compare dumps `a` and `b` (rlprobe or msprobe format); publish the results as the folder
    `out`; return the summary. Raises ProbeError when a run cannot be read or `out` cannot be
    written (or holds files rlprobe did not write); `out` then keeps its earlier files.
    `extra_files(folder)` adds files to the folder before it is published (msprobe's layout).
    `key_map`: a trainer's key names; `config_ignore`: config paths the config diff leaves out. `keys`, `steps`
    and `ranks` as the command takes them ("log_prob,kl", "0-10,12") or as lists; SelectionError (a ProbeError)
    for one that is malformed or names nothing the runs hold. `tolerance`: when a pair that is not bitwise
    equal agrees (`close`): a number (rtol), or {rtol, atol, stats_rtol, families: {log_probs: {rtol: ...}},
    keys: {advantages: {...}}} (docs/across-devices.md, "Tolerances"); `rtol`, `atol`, `stats_rtol` over it.
    `control`: a control run's dump, which differs from `a` by noise only: B diverges where its error exceeds
    the control's by the documented factor (docs/across-devices.md, "A control run"); ControlRunError (a ProbeError)
    for one that is missing, no dump, or without key data in common with `a`.
    `options`: a rlprobe.comparison.options.CompareOptions instead of the comparison's arguments (with `control`
    given too, it replaces the options' control). `runtime`: a rlprobe.comparison.options.Runtime, how the caller
    takes part (the command's: the DuckDB connection opened ahead by rlprobe.cli.startup.ConnectionAhead, its
    report modules imported beside the pairs); `progress` over its own."""
    from dataclasses import replace

    from rlprobe.comparison.options import CompareOptions, Runtime

    if options is None:  # as the command line and pipelines take them: "0-10,12", "log_prob,kl" or lists
        options = CompareOptions.build(keys=keys, steps=steps, ranks=ranks, tolerance=tolerance, rtol=rtol, atol=atol,
                                       stats_rtol=stats_rtol, workers=workers, order=order, key_map=key_map,
                                       config_ignore=config_ignore, config_ignore_defaults=config_ignore_defaults,
                                       control=control)
    elif control is not None:
        options = options.with_(control=control)
    workers = options.workers
    from rlprobe.lake.msprobe_scan import ReadingsAhead

    # msprobe dumps' statistics are read in second processes while the modules below load
    with ReadingsAhead((b,)) as readings:
        from rlprobe.comparison.run import compare_dumps
        from rlprobe.lake.reader import open_dump
        from rlprobe.report.comparison_files import ReportOptions, write_reports, write_summary_json, write_tables
        from rlprobe.report.output_folder import prepare_output, publish_output

        started = time.perf_counter()
        out = Path(out)
        prepare_output(out, "output directory")  # before the work: a folder of other files is refused at once
        dump_a, dump_b = open_dump(a), open_dump(b)
        dump_b.reading_ahead.start(readings.take(0))
    rendered = None
    if reports and workers > 1:  # key_data's files rendered by a thread once it is known (comparison_files.py)
        from rlprobe.report.comparison_files import KeyDataFiles

        rendered = KeyDataFiles(lang)
    runtime = runtime or Runtime()
    tables, summary = compare_dumps(dump_a, dump_b, options, replace(
        runtime, progress=progress or runtime.progress, key_data_ready=rendered and rendered.start,
        stats=False))  # stats_a and stats_b: written nowhere
    summary["elapsed_s"] = round(time.perf_counter() - started, 3)
    options = ReportOptions(lang=lang, per_key_dir=per_key_dir if per_key_files else None, plots=plots,
                            plot_every_param=plot_every_param, workers=workers)

    def write(folder: Path) -> None:
        xlsx_extras = write_tables(folder, tables, key_data=not reports)  # else beside the workbook
        write_summary_json(folder, summary)
        if reports:
            write_reports(folder, tables, summary, xlsx_extras, options, key_data_parquet=True, rendered=rendered)
        if extra_files is not None:
            extra_files(folder)

    publish_output(out, write, label="output directory")
    return summary


def run_compare(run_a: str, run_b: str, out: str, *, fail_on_diff: bool, quiet: bool, plots: bool,
                plot_every_param: bool = False, **options: Any) -> int:
    """The command: progress bar, comparison, verdict; returns the exit code."""
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
        summary = compare(run_a, run_b, out, progress=callback, plots=plots, plot_every_param=plot_every_param,
                          **options)
    except SelectionError as e:  # --keys/--steps/--ranks that name nothing the runs hold: usage
        console.print(f"[red]error:[/] {escape(str(e))}")
        return EXIT_USAGE
    except (DumpReadError, ProbeError) as e:
        console.print(f"[red]error:[/] {escape(str(e))}")
        return EXIT_UNREADABLE
    finally:
        if progress_bar is not None:
            progress_bar.stop()
    print_verdict(make_console(), summary, out)
    from rlprobe.report.comparison_words import differs

    return EXIT_DIVERGED if differs(summary) and fail_on_diff else EXIT_OK


def print_verdict(console: Console, summary: dict[str, Any], out: str) -> None:
    counts = ", ".join(whole(f"{n} {status}") for status, n in sorted(summary["counts"].items())) or "no key data"
    console.print(f"compared {whole(summary['run_a'])} (A) with {whole(summary['run_b'])} (B): {counts}")
    if (summary.get("layout") or {}).get("note"):  # runs with different layouts: docs/compare.md
        console.print(f"[yellow]note[/]: {escape(str(summary['layout']['note']))}")
    control = summary.get("control")
    if control:  # a control run's noise envelope: docs/across-devices.md, "A control run"
        factor = whole(format(control["factor"], "g"))
        console.print(f"control run {whole(control['path'])}: B's errors judged against {factor} x the control's too")
    first = summary["first_divergence"]
    if first is None and (summary.get("module_first_divergence") or summary.get("grad_first_flagged")):
        from rlprobe.report.comparison_words import verdict

        console.print(f"[bold red]{escape(verdict(summary))}[/]")
        console.print(f"[bold]suspect[/]: {escape(str(summary['suspect']))}")
        console.print(f"[bold]next[/]: {escape(str(summary['advice']))}")
    elif first is None and summary.get("compared") == []:  # two empty dumps, or a capture that saved nothing
        console.print("[yellow]nothing compared[/]: neither run holds key data, gradients, module dumps or parameter "
                      "fingerprints")
        console.print(f"[bold]next[/]: {escape(str(summary['advice']))}")
    elif first is None and summary.get("first_difference"):  # only close rows: within rounding
        from rlprobe.report.comparison_words import within_rounding

        console.print(f"[green]no divergence beyond rounding[/]: {escape(within_rounding(summary['first_difference']))}")
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
    from rlprobe.report.markdown import console_lines

    for line in console_lines(summary):  # issue 14: the config diff and warnings
        console.print(escape(line), highlight=False)
    reports = ", ".join(whole(f"{out}/{name}") for name in ("report.xlsx", "summary.md", "key_data.parquet"))
    console.print(f"report: {reports}")
