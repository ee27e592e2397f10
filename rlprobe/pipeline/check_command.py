"""`rlprobe check DUMP [-o OUT]` and `rlprobe.check(dump, out=...)`: check one run (rlprobe.check),
publish its reports as the folder OUT by the one publish rule (rlprobe.report.output_folder: a work
folder beside OUT swapped in whole; an OUT of other files is refused, exit 3), print the results.
Registered in rlprobe/cli/__init__.py by one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from rlprobe.errors import DumpReadError, EXIT_UNREADABLE, EXIT_USAGE, ProbeError


def check(dump: Any, out: str | Path | None = None, params: dict[str, Any] | None = None, *, plots: bool = True,
          key_map: dict[str, str] | None = None, **more_params: Any) -> Any:
    """Run every check on one dump; with `out`, publish the reports there (check.parquet, summary.json/md,
    report.xlsx, plots/). Parameters (thresholds, eps, group_size...) as in docs/check.md, given as
    `params` or keywords; `key_map` {saved: canonical} reads a trainer's key names (rlprobe/key_names.csv adds). Raises DumpReadError, ValueError (a bad parameter) or OutputError (`out`
    cannot be written or holds files rlprobe did not write; it keeps its earlier files)."""
    from rlprobe.checks import check_dump

    if out is not None:
        from rlprobe.report.output_folder import prepare_output, publish_output

        prepare_output(Path(out), "output directory")  # before the work: a folder of other files is refused
    result = check_dump(dump, {**(params or {}), **more_params}, key_map=key_map)
    if out is not None:
        from rlprobe.report.check_report import write_check_outputs

        publish_output(Path(out), lambda folder: write_check_outputs(result, folder, plots=plots),
                       label="output directory")
    return result


def parse_params(items: tuple[str, ...]) -> dict[str, Any]:
    """NAME=VALUE pairs; VALUE as JSON (0.1, true, "x"), else the text."""
    params = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"{item!r}: expected NAME=VALUE, e.g. eps=0.1", param_hint="--param")
        try:
            params[name.strip()] = json.loads(value)
        except ValueError:
            params[name.strip()] = value
    return params


@click.command("check")
@click.argument("dump", type=click.Path())
@click.option("-o", "--out", type=click.Path(file_okay=False),
              help="Write check.parquet, summary.json/md, report.xlsx and plots/ here (created).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
              help="A threshold or setting, e.g. eps=0.1, max_mean_abs_delta=0.01 (docs/check.md lists them).")
@click.option("--key-map", "key_map", multiple=True, metavar="SAVED=CANONICAL",
              help="Read a saved key as a canonical one, e.g. my_lp=log_prob (repeatable; as rlprobe compare's).")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def check_command(dump: str, out: str | None, params: tuple[str, ...], key_map: tuple[str, ...], no_plots: bool,
                  as_json: bool) -> None:
    """What is wrong inside ONE run (no baseline): rollout vs trainer log-probs, on-policy ratio,
    KL at the first step, GRPO advantages, NaN/inf, loss, gradient spikes, entropy and KL trends.

    Exit codes: 0 every applicable check passed, 1 a check failed, 2 a bad parameter, 3 unreadable dump.
    """
    from rlprobe.comparison.key_aliases import parse_key_map

    try:
        key_mapping = parse_key_map(key_map)
    except ProbeError as e:
        raise click.BadParameter(str(e), param_hint="--key-map") from None
    try:
        result = check(dump, out=Path(out) if out else None, params=parse_params(params), plots=not no_plots,
                       key_map=key_mapping)
    except DumpReadError as e:
        click.secho(f"error: cannot check {dump}: {e}", fg="red", err=True)
        raise click.exceptions.Exit(EXIT_UNREADABLE) from None
    except ValueError as e:
        click.secho(f"error: {e}", fg="red", err=True)
        raise click.exceptions.Exit(EXIT_USAGE) from None
    except ProbeError as e:
        click.secho(f"error: {e}", fg="red", err=True)
        raise click.exceptions.Exit(EXIT_UNREADABLE) from None
    if as_json:
        from rlprobe.report.comparison_files import jsonable

        click.echo(json.dumps(jsonable(result.summary()), indent=2))
    else:
        print_results(result, out)
    raise click.exceptions.Exit(result.exit_code)


def print_results(result: Any, out: str | None) -> None:
    from rlprobe.report.check_report import verdict_line

    click.echo(f"check {result.dump}: {verdict_line(result)}")
    for r in result.results.to_pylist():
        detail = r["first"] if r["status"] in ("fail", "warn") else r["note"]
        line = f"  {r['status']:<15} {r['check']}"
        if r["rows"]:
            line += f" ({r['rows']} rows)"
        click.echo(line + (f": {detail}" if detail else ""))
    for note in result.notes:
        click.echo(f"note: {note}")
    if out:
        click.echo(f"reports: {Path(out) / 'summary.md'}, {Path(out) / 'report.xlsx'}")
