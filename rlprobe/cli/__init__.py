"""The `rlprobe` command. Heavy libraries load inside each command, so `--help` is instant."""

from __future__ import annotations

from pathlib import Path

import click

from rlprobe._version import __version__
from rlprobe.errors import EXIT_UNREADABLE, EXIT_USAGE, DumpReadError, ProbeError


def _open(path: str, include_uncommitted: bool = False):
    import rlprobe

    try:
        return rlprobe.open(path, include_uncommitted)
    except DumpReadError as e:
        raise click.exceptions.Exit(_err(str(e), EXIT_UNREADABLE)) from None


def _tolerance(value: float | None) -> float | None:
    if value is None:
        return None
    if not value >= 0 or value == float("inf"):  # NaN too: DuckDB orders NaN above every number, so every row agreed
        raise click.BadParameter(f"{value!r} is not a tolerance (a finite number >= 0)")
    return value


def _err(message: str, code: int) -> int:
    click.secho(f"error: {message}", fg="red", err=True)
    return code


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="rlprobe")
@click.pass_context
def main(ctx: click.Context) -> None:
    """rlprobe: find where RL training of LLMs goes numerically wrong.

    Capture key data in training with rlprobe.Probe, then inspect and query the dumps here.
    Every command takes rlprobe dumps and msprobe dumps alike.
    """
    if ctx.invoked_subcommand != "demo":  # the demo trains a model: its imports are its own
        from rlprobe.cli.startup import refused

        ctx.with_resource(refused())  # pandas: start-up no command needs (issue 18)


_INCLUDE_UNCOMMITTED = click.option(
    "--include-uncommitted", is_flag=True,
    help="Also the rows of steps a killed run wrote but never committed, and of ranks without rank<R>.json.")


@main.command()
@click.argument("dump", type=click.Path(file_okay=True, dir_okay=True))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of tables.")
@_INCLUDE_UNCOMMITTED
def info(dump: str, as_json: bool, include_uncommitted: bool) -> None:
    """What DUMP holds: keys, steps, ranks, micro steps, dtypes, bytes, whether complete.

    On a comparison's or pipeline's output folder: the runs compared, the first divergence, the
    counts, the gates and the tables `rlprobe sql` reads, with their row counts."""
    from rlprobe.pipeline import info_output
    from rlprobe.pipeline.cli_support import is_result_dir

    if is_result_dir(Path(dump)):
        from rlprobe.pipeline.cli_support import result_info

        _print_info(lambda: result_info(Path(dump)), as_json, info_output.print_result_summary)
        return
    from rlprobe.pipeline.info_output import dump_info

    d = _open(dump, include_uncommitted)
    _print_info(lambda: dump_info(d), as_json, info_output.print_dump_summary)


def _print_info(read, as_json: bool, print_summary) -> None:
    """`rlprobe info`'s output of the summary `read()` gives: JSON, or `print_summary`'s table; exit 3 where it
    cannot be read."""
    try:
        summary = read()
    except DumpReadError as e:
        raise click.exceptions.Exit(_err(str(e), EXIT_UNREADABLE)) from None
    if as_json:
        import json

        click.echo(json.dumps(summary, indent=2, default=str))
        return
    print_summary(summary)


def _connect(path: str, include_uncommitted: bool):
    """DuckDB over a dump (views key_data, scalars, configs) or a comparison's output folder (a view per table)."""
    from rlprobe.pipeline.cli_support import connect_result_dir, is_result_dir

    if is_result_dir(Path(path)):
        return connect_result_dir(Path(path))
    return _open(path, include_uncommitted).connect()


@main.command()
@click.argument("args", nargs=-1, required=True, metavar="[DUMP|OUT] QUERY")
@click.option("--run", "runs", multiple=True, metavar="NAME=PATH",
              help="A dump or comparison result directory, visible as schema NAME (repeatable).")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "parquet"]), default="table",
              show_default=True, help="Output format; parquet needs --output.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the result to this file.")
@click.option("--max-rows", type=click.IntRange(min=0), default=50, show_default=True, help="Rows shown in table format.")
@_INCLUDE_UNCOMMITTED
def sql(args: tuple[str, ...], runs: tuple[str, ...], fmt: str, output: str | None, max_rows: int,
        include_uncommitted: bool) -> None:
    """Run a DuckDB QUERY over DUMP (views: key_data, scalars, configs), a comparison's output folder
    OUT (one view per Parquet file, as --run gives), or over several runs.

    \b
    rlprobe sql ./dump "SELECT key, step, max(max) FROM key_data GROUP BY ALL"
    rlprobe sql --run a=./dumps/a --run b=./dumps/b \\
      "SELECT a.key, a.step, a.mean, b.mean FROM a.key_data a JOIN b.key_data b USING (key, step, rank, micro_step, index)"
    rlprobe sql --run mon=./out/mon --run tue=./out/tue "SELECT run, status, count(*) FROM all_key_data GROUP BY ALL"

    With --run, each run is a schema (NAME.key_data, NAME.scalars, NAME.configs; a result
    directory gives one view per Parquet file) and all_<table> stacks them with a run column.
    """
    import duckdb

    from rlprobe.lake.sql_runner import to_arrow

    if fmt == "parquet" and not output:
        raise click.UsageError("--format parquet writes a file: give --output FILE.parquet")
    if len(args) > 2 or (len(args) == 1 and not runs):
        raise click.UsageError("give DUMP QUERY, or --run NAME=PATH (repeatable) and QUERY")
    query = args[-1]
    from rlprobe.pipeline.cli_support import attach_runs, check_every_file, parse_run_option

    paths = list(args[:-1])  # what the query reads: a failure inside a file is traced to it
    try:
        if runs:
            pairs = [parse_run_option(r) for r in runs]
            paths += [path for _, path in pairs]
            con = _connect(args[0], include_uncommitted) if len(args) == 2 else None
            con = attach_runs(pairs, con, include_uncommitted=include_uncommitted)
        else:
            con = _connect(args[0], include_uncommitted)
        result = con.sql(query)
        # a statement without rows (SET): None. Read whole here: a lazy reader would raise a corrupt
        # page's error later, as a pyarrow OSError that the handlers below never see
        table = None if result is None else to_arrow(result)
    except DumpReadError as e:
        raise click.exceptions.Exit(_err(str(e), EXIT_UNREADABLE)) from None
    except ProbeError as e:
        raise click.exceptions.Exit(_err(str(e), EXIT_USAGE)) from None
    except duckdb.Error as e:
        if not isinstance(e, (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException)):
            try:  # DuckDB names no file for a corrupt data page: read them all to find it
                check_every_file(paths)
            except DumpReadError as bad:
                raise click.exceptions.Exit(_err(str(bad), EXIT_UNREADABLE)) from None
        raise click.exceptions.Exit(_err(f"query failed: {e}", EXIT_USAGE)) from None
    if table is None:
        return
    from rlprobe.pipeline.info_output import write_table

    try:
        write_table(table, fmt, output, max_rows)
    except ProbeError as e:  # an output file that cannot be written: named, nothing half-written left
        raise click.exceptions.Exit(_err(str(e), EXIT_UNREADABLE)) from None


@main.command()
@click.argument("run_a")
@click.argument("run_b")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False), help="Output directory (created).")
@click.option("--keys", help="Only these keys, comma-separated (e.g. log_prob,ref_log_prob).")
@click.option("--steps", help="Only these steps, e.g. 0-10,12.")
@click.option("--ranks", help="Only these ranks, e.g. 0,2-3.")
@click.option("--workers", type=click.IntRange(1, 256), default=2, show_default=True, help="Parallel comparison workers.")
@click.option("--rtol", type=float, callback=lambda ctx, param, value: _tolerance(value),
              help="Relative tolerance of every float key (not tokens), instead of the dtype's default "
                   "(float32 1.5e-05: docs/across-devices.md, Tolerances); a pair within it is 'close', no divergence.")
@click.option("--atol", type=float, callback=lambda ctx, param, value: _tolerance(value),
              help="Absolute tolerance (default: rtol x 1 for log-probs, rtol / 16 for the other keys).")
@click.option("--stats-rtol", type=float, callback=lambda ctx, param, value: _tolerance(value),
              help="Relative tolerance of rows saved as statistics only (default: --rtol or the dtype's; 0: exact).")
@click.option("--control", metavar="RUN_C",
              help="A control run: RUN_A's code rerun with noise only (without determinism, or on RUN_B's device "
                   "with a version known to be good); B diverges where its error exceeds C's by the factor of "
                   "docs/across-devices.md ('A control run'), or the dtype tolerance where that is larger.")
@click.option("--lang", type=click.Choice(["en", "zh"]), default="en", show_default=True,
              help="Report column headers; zh gives msprobe's Chinese headers.")
@click.option("--per-key-files", is_flag=True, help="Also write msprobe-style <key>.xlsx files (in OUT/per_key).")
@click.option("--plots", is_flag=True, help="Also write PNG plots (OUT/plots).")
@click.option("--plot-every-param", is_flag=True,
              help="With the plots, one PNG per gradient parameter (OUT/plots/grad_params); implies --plots.")
@click.option("--fail-on-diff", is_flag=True,
              help="Exit with code 1 when anything diverges beyond tolerance ('close' rows agree).")
@click.option("--quiet", is_flag=True, help="No progress bar, only the verdict.")
@click.option("--key-map", "key_map", multiple=True, metavar="SAVED=CANONICAL",
              help="Read saved key SAVED as the data-flow key CANONICAL, e.g. old_log_probs=old_log_prob (repeatable).")
@click.option("--config-ignore", multiple=True, metavar="GLOB",
              help="Leave config paths matching GLOB out of the config diff, e.g. trainer.project_name (repeatable).")
@click.option("--no-default-config-ignore", is_flag=True,
              help="Show the config paths the default ignore list leaves out (output paths, run names, ...).")
def compare(run_a, run_b, out, keys, steps, ranks, workers, rtol, atol, stats_rtol, control, lang, per_key_files, plots,
            plot_every_param, fail_on_diff, quiet, key_map, config_ignore, no_default_config_ignore):
    """Compare two runs (rlprobe or msprobe dumps) and say where they diverge first.

    \b
    Writes OUT/key_data.parquet, key_data.csv, report.xlsx, summary.json and summary.md.
    Exit codes: 0 compared, 1 diverged (with --fail-on-diff), 2 usage, 3 a run cannot be read
    or OUT cannot be written.
    """
    from rlprobe.cli.startup import ConnectionAhead

    with ConnectionAhead() as ahead:  # DuckDB starts its database on a thread while the comparison's modules load
        from rlprobe.selection import parse_int_set, parse_key_list

        try:
            step_list = parse_int_set(steps, "--steps")
            rank_list = parse_int_set(ranks, "--ranks")
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
        key_list = parse_key_list(keys, "--keys")
        from rlprobe.comparison.key_aliases import parse_key_map

        try:
            key_mapping = parse_key_map(key_map)
        except ProbeError as e:
            raise click.BadParameter(str(e), param_hint="--key-map") from None
        from rlprobe.cli.startup import import_report_modules
        from rlprobe.comparison.options import Runtime
        from rlprobe.pipeline.compare_command import run_compare

        code = run_compare(run_a, run_b, out, keys=key_list, steps=step_list, ranks=rank_list, workers=workers,
                           rtol=rtol, atol=atol, stats_rtol=stats_rtol, control=control, lang=lang,
                           per_key_files=per_key_files, plots=plots,
                           plot_every_param=plot_every_param, fail_on_diff=fail_on_diff, quiet=quiet,
                           key_map=key_mapping, config_ignore=list(config_ignore),
                           config_ignore_defaults=not no_default_config_ignore,
                           runtime=Runtime(connect=ahead.take, beside_pairs=import_report_modules))
    from rlprobe.cli.startup import outputs_closed

    outputs_closed()  # OUT is published (or kept as it was): the process may end without teardown
    raise click.exceptions.Exit(code)


@main.command()
@click.argument("dump", type=click.Path(exists=True, file_okay=False))
def compact(dump: str) -> None:
    """Merge every rank's stats parts of DUMP into one file per kind and remove leftovers.

    A rank whose writer is still alive is left as it is. Exit codes: 0 every rank compacted,
    1 a rank left as it was (named), 2 not an rlprobe dump, 3 DUMP cannot be read (a damaged or
    foreign part, named: nothing was compacted).
    """
    from rlprobe.lake.rank_writer import compact as run

    d = _open(dump)
    if d.format != "rlprobe":
        raise click.exceptions.Exit(_err(f"{dump} is an {d.format} dump; only rlprobe dumps have parts to compact", EXIT_USAGE))
    try:
        result = run(dump)
    except ProbeError as e:  # a damaged or foreign part (nothing compacted), or a lock file that cannot be opened
        raise click.exceptions.Exit(_err(str(e), EXIT_UNREADABLE)) from None
    click.echo(f"{dump}: {result['files_before']} files -> {result['files_after']}"
               + (f"; {result['tensor_leftovers']} leftover(s) of killed writers removed among the tensor files"
                  if result["tensor_leftovers"] else ""))
    for message in result["refused"]:
        _err(message, 1)
    if result["refused"]:
        raise click.exceptions.Exit(1)


@main.command()
@click.option("--fault", type=click.Choice(["ref-bf16", "nondeterministic", "advantage-bug", "sampling-seed", "lr", "all"]),
              default="ref-bf16", show_default=True, help="The fault to plant in the second run ('all': each in turn).")
@click.option("--out", type=click.Path(file_okay=False), default="./rlprobe_demo", show_default=True,
              help="Where the dumps, configs and reports go.")
@click.option("--steps", type=click.IntRange(1, 50), help="PPO steps per run (default: the example config's).")
def demo(fault: str, out: str, steps: int | None) -> None:
    """Plant a fault in a tiny real PPO run and watch rlprobe find it.

    \b
    Trains the example PPO model (examples/ppo) twice on the CPU, a baseline and a faulted
    run, captures key data and gradients, compares them with pipelines/compare.yaml, then
    re-runs both with the module dump the summary advises and names the first diverging module.
    """

    from rlprobe.demo import FAULTS, run_demo

    faults = FAULTS if fault == "all" else (fault,)
    try:
        for name in faults:
            target = Path(out) / name if fault == "all" else Path(out)
            if len(faults) > 1:
                click.secho(f"== fault: {name}", bold=True)
            run_demo(name, target, steps=steps, say=click.echo)
    except ProbeError as e:
        raise click.exceptions.Exit(_err(str(e), EXIT_UNREADABLE)) from None


def _register_check() -> None:
    from rlprobe.pipeline.check_command import check_command

    main.add_command(check_command)


_register_check()


@main.command("import-msprobe")
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.argument("dst", type=click.Path())
def import_msprobe(src: str, dst: str) -> None:
    """Convert the msprobe SingleSave dump SRC into an rlprobe dump at DST."""
    from rlprobe.lake.importer import import_msprobe as run

    try:
        result = run(src, dst)
    except DumpReadError as e:
        raise click.exceptions.Exit(_err(str(e), EXIT_UNREADABLE)) from None
    except ProbeError as e:
        raise click.exceptions.Exit(_err(str(e), EXIT_USAGE)) from None
    click.echo(f"imported {result['tensors']} tensors from {result['ranks']} rank(s) into {dst}")


@main.group()
def pipeline() -> None:
    """Declared, repeatable comparisons: validate and run pipeline YAML files (see pipelines/)."""


_SET_OPTION = click.option("--set", "overrides", multiple=True, metavar="FIELD.PATH=VALUE",
                           help="Override a field, e.g. --set runs.candidate=./dumps/b (repeatable).")


@pipeline.command("validate")
@click.argument("file", type=click.Path(dir_okay=False))
@_SET_OPTION
def pipeline_validate(file: str, overrides: tuple[str, ...]) -> None:
    """Check FILE: fields, types, SQL files, run directories. Exit 0 valid, 2 bad spec, 3 a run missing."""
    from rlprobe.pipeline.cli_support import validate_command

    raise click.exceptions.Exit(validate_command(file, overrides))


@pipeline.command("run")
@click.argument("file", type=click.Path(dir_okay=False))
@_SET_OPTION
@click.option("--dry-run", is_flag=True, help="Validate and print what would run; compare nothing.")
@click.option("--quiet", is_flag=True, help="No progress, only the verdict.")
def pipeline_run(file: str, overrides: tuple[str, ...], dry_run: bool, quiet: bool) -> None:
    """Run the pipeline FILE: compare, queries, gates, reports, history.

    \b
    Exit codes: 0 every gate passed, 1 a gate failed, 2 bad spec, usage or a failing query,
    3 a run that cannot be read or an output that cannot be written.
    """
    from rlprobe.pipeline.cli_support import run_command

    raise click.exceptions.Exit(run_command(file, overrides, dry_run=dry_run, quiet=quiet))


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--plots", "plots_dir", type=click.Path(file_okay=False),
              help="Folder for the trend PNGs (default: <FILE stem>_plots beside FILE).")
@click.option("--no-plots", is_flag=True, help="Only print the table.")
@click.option("--last", type=click.IntRange(1), default=30, show_default=True, help="Runs shown in the table.")
def history(file: str, plots_dir: str | None, no_plots: bool, last: int) -> None:
    """Show a pipeline history FILE (Parquet) as a table of runs and write trend plots."""
    from rlprobe.pipeline.cli_support import history_command

    raise click.exceptions.Exit(history_command(file, plots_dir, no_plots, last))


def console() -> None:
    """The `rlprobe` console script: main(), ended by rlprobe.cli.startup.run; the native libraries'
    settings (rlprobe.cli.startup.apply_for_command_line) made before any of them loads."""
    from rlprobe.cli.startup import apply_for_command_line, run

    apply_for_command_line()

    run(main)
