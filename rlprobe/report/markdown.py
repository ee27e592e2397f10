"""summary.md: the comparison in a few lines and tables, fit for a CI comment.

The config diff and the warnings as the console, summary.md and the xlsx Summary show them (markdown_lines and
the like: the summary's config_diff, config_cause, config_ignored and warnings, computed by
rlprobe.comparison.config_diff), and the parameter-update finding as one line (param_line: the summary's
param_first_difference, by rlprobe.comparison.params).

Last, what a pipeline run adds to the comparison reports (write_junit and the like): JUnit XML (one test case
per gate) and the Markdown summary with the failing gates' first rows, fit for a CI comment.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from rlprobe.lake.configs import value_text
from rlprobe.report.comparison_words import (MATCHING_STATUSES, cell_text, differs, format_number, list_text,
                                         ordered_counts, rollup_columns, verdict, yaml_lines)
from rlprobe.report.headers import header
from rlprobe.report.output_folder import write_report_file

MAX_DIVERGING_ROWS = 20
MAX_STEP_ROWS = 50  # a CI comment holds about 65,000 characters
MAX_CELL_CHARS = 200
# close: within rounding; the tolerance each key was judged by and its largest error against it
KEY_COLUMNS = ("key", "rows", "match", "matching", "close", "mismatch", "diverging", "other", "only_in_a", "only_in_b",
               "errors", "first_divergent_step", "max_abs_err", "max_rel_err", "max_norm_rel_err", "rtol", "atol",
               "tolerance_source", "envelope")
STEP_COLUMNS = ("step", "rows", "close", "diverging", "diverged_keys", "max_abs_err", "max_rel_err")
ROW_COLUMNS = ("key", "step", "rank", "micro_step", "index", "status", "shape_a", "shape_b", "same_pct",
               "max_abs_err", "max_rel_err", "message")


def write_summary_md(path: str | Path, summary: Mapping[str, Any], key_data: pa.Table) -> Path:
    """Write the Markdown summary of a comparison (see render_summary_md)."""
    text = render_summary_md(summary, key_data).encode("utf-8")
    return write_report_file(path, lambda f: f.write(text))


def render_summary_md(summary: Mapping[str, Any], key_data: pa.Table) -> str:
    """Verdict, suspect and advice, counts per status, the per-key and per-step tables and the
    first non-matching rows."""
    mark = "❌" if differs(summary) else "⚠️" if summary.get("compared") == [] else "✅"
    lines = [f"## rlprobe: {mark} {escape_md(verdict(summary))}", ""]
    if summary.get("run_a") or summary.get("run_b"):
        lines += [f"Run A: `{_code(summary.get('run_a'))}`  ", f"Run B: `{_code(summary.get('run_b'))}`", ""]
    for what in ("suspect", "advice"):
        if summary.get(what):
            lines += [f"**{what.capitalize()}:** {escape_md(str(summary[what]))}", ""]
    if summary.get("first_divergence"):  # the other findings, which the verdict line names only without it
        if summary.get("module_suspect"):
            lines += [f"**Module dumps:** {escape_md(str(summary['module_suspect']))}", ""]
        grad = summary.get("grad_first_flagged")
        if grad:
            lines += [f"**Gradients:** monitor {escape_md(repr(grad.get('monitor')))} flagged at step {grad.get('step')}, "
                      f"rank {grad.get('rank')}: {escape_md(str(grad.get('reason')))}", ""]
    if summary.get("next_config"):
        lines += ["Next capture config:", "", "```yaml", *yaml_lines(summary["next_config"]), "```", ""]
    if (summary.get("layout") or {}).get("note"):  # runs with different layouts: docs/compare.md
        lines += [f"**Layout:** {escape_md(str(summary['layout']['note']))}", ""]
    control = summary.get("control")
    if control:  # a control run's noise envelope: docs/across-devices.md, "A control run"
        lines += [f"**Control run:** `{_code(control.get('path'))}` (B's errors judged against "
                  f"{format_number(control.get('factor'))} x its own too)", ""]
    lines += markdown_lines(summary, escape_md)  # issue 14: config diff and warnings
    errors = summary.get("read_errors") or []
    if errors:
        lines += [f"**Read errors ({len(errors)}):**", ""] + [f"- {escape_md(str(e))}" for e in errors] + [""]

    counts = ordered_counts(summary.get("counts"))
    if counts:
        lines += ["### Rows per status", "", *table(["status", "rows"], [list(c) for c in counts]), ""]
    keys = summary.get("keys") or []
    if keys:
        columns = rollup_columns(keys, KEY_COLUMNS)
        lines += ["### Per key", "", *table([header(c) for c in columns], _records(keys, columns)), ""]
    steps = [s for s in summary.get("steps") or [] if _diverging(s)]
    if steps:
        columns = rollup_columns(steps, STEP_COLUMNS)
        lines += ["### Steps with divergence", "",
                  *table([header(c) for c in columns], _records(steps[:MAX_STEP_ROWS], columns))]
        if len(steps) > MAX_STEP_ROWS:
            lines.append(f"\n… and {len(steps) - MAX_STEP_ROWS} more steps with divergence (see report.xlsx)")
        lines.append("")
    gates = summary.get("gates") or []
    if gates:
        columns = rollup_columns(gates, ("name", "passed", "rows"))
        lines += ["### Gates", "", *table(columns, _records(gates, columns)), ""]

    shown, total = _non_matching_rows(key_data)
    if total:
        title = f"### First {len(shown)} of {total} non-matching rows" if total > len(shown) else "### Non-matching rows"
        columns = [c for c in ROW_COLUMNS if c in key_data.column_names]
        lines += [title, "", *table([header(c) for c in columns], [[r.get(c) for c in columns] for r in shown]), ""]
    if summary.get("elapsed_s") is not None:
        lines.append(f"<sub>compared in {format_number(summary['elapsed_s'])} s</sub>")
    return "\n".join(lines).rstrip() + "\n"


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A GitHub-flavoured Markdown table; cells escaped, numbers formatted."""
    out = ["| " + " | ".join(escape_md(str(c)) for c in columns) + " |",
           "|" + "|".join("---" for _ in columns) + "|"]
    out += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return out


def escape_md(text: str) -> str:
    """Text safe inside a table cell: pipes escaped, HTML tags shown as text, line breaks as <br>."""
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
    return text.replace("\r\n", "<br>").replace("\n", "<br>").replace("\r", "<br>")


def _cell(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        value = list_text(value)
    text = value if isinstance(value, str) else format_number(value)
    if len(text) > MAX_CELL_CHARS:
        text = text[: MAX_CELL_CHARS - 1] + "…"
    return escape_md(text)


def _records(records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[list[Any]]:
    return [[cell_text(r.get(c)) for c in columns] for r in records]


def _code(value: Any) -> str:
    return str(value).replace("`", "'")


def _diverging(step: Mapping[str, Any]) -> bool:
    return any(step.get(c) for c in ("diverging", "diverged_keys", "mismatch"))


def _non_matching_rows(key_data: pa.Table) -> tuple[list[dict[str, Any]], int]:
    """The first MAX_DIVERGING_ROWS rows whose status is not one of MATCHING_STATUSES, and how many there are."""
    if "status" not in key_data.column_names or key_data.num_rows == 0:
        return [], 0
    status = key_data.column("status").cast(pa.string())
    mask = pc.invert(pc.is_in(status, value_set=pa.array(sorted(MATCHING_STATUSES), pa.string())))
    rows = key_data.filter(pc.fill_null(mask, True))
    return rows.slice(0, MAX_DIVERGING_ROWS).to_pylist(), rows.num_rows


MAX_GATE_ROWS = 10


@dataclass
class GateResult:
    name: str
    description: str
    origin: str
    rows: pa.Table
    elapsed_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.rows.num_rows == 0

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "rows": self.rows.num_rows,
                "description": self.description, "sql": self.origin}


def junit_xml(pipeline: str, gates: list[GateResult], elapsed_s: float) -> bytes:
    """<testsuites> with one <testcase> per gate; a failing gate's first rows in <failure>."""
    failures = sum(not g.passed for g in gates)
    suites = ET.Element("testsuites", name=f"rlprobe pipeline {pipeline}", tests=str(len(gates)),
                        failures=str(failures), errors="0", time=f"{elapsed_s:.3f}")
    suite = ET.SubElement(suites, "testsuite", name=pipeline, tests=str(len(gates)), failures=str(failures),
                          errors="0", skipped="0", time=f"{elapsed_s:.3f}")
    for g in gates:
        case = ET.SubElement(suite, "testcase", classname=f"rlprobe.pipeline.{pipeline}", name=g.name,
                             time=f"{g.elapsed_s:.3f}")
        if g.description:
            ET.SubElement(case, "system-out").text = g.description
        if not g.passed:
            failure = ET.SubElement(case, "failure", type="GateFailed",
                                    message=f"{g.name}: {g.rows.num_rows} row(s) returned by {g.origin}")
            failure.text = rows_text(g.rows)
    ET.indent(suites)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True) + b"\n"


def rows_text(rows: pa.Table, limit: int = MAX_GATE_ROWS) -> str:
    lines = [", ".join(f"{k}={v}" for k, v in r.items()) for r in rows.slice(0, limit).to_pylist()]
    if rows.num_rows > limit:
        lines.append(f"... and {rows.num_rows - limit} more rows")
    return "\n".join(lines)


def render_pipeline_md(pipeline: str, summary: Mapping[str, Any], key_data: pa.Table,
                       gates: list[GateResult]) -> str:
    """The comparison summary, headed by the gate verdict, then each failing gate's first rows."""
    failed = [g for g in gates if not g.passed]
    if gates:
        head = (f"# Pipeline `{pipeline}`: {'❌ ' + str(len(failed)) + ' of ' + str(len(gates)) + ' gates failed' if failed else '✅ all ' + str(len(gates)) + ' gates passed'}")
    else:
        head = f"# Pipeline `{pipeline}`"
    lines = [head, "", render_summary_md(summary, key_data).rstrip(), ""]
    for g in failed:
        lines += [f"### Gate `{g.name}` failed: {g.rows.num_rows} row(s)", ""]
        if g.description:
            lines += [escape_md(g.description), ""]
        shown = g.rows.slice(0, MAX_GATE_ROWS).to_pylist()
        lines += table(g.rows.column_names, [list(r.values()) for r in shown])
        if g.rows.num_rows > MAX_GATE_ROWS:
            lines.append(f"\n… and {g.rows.num_rows - MAX_GATE_ROWS} more (gates/{g.name}.parquet)")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


MAX_LINES = 30  # the console and summary.md; summary.json and the xlsx have every path
COLUMNS = ("path", "value_a", "value_b", "family")


def change_line(row: Mapping[str, Any]) -> str:
    """'ppo.temperature: A=1.0, B=0.7 (sampling)'."""
    family = f" ({row['family']})" if row.get("family") else ""
    return f"{row['path']}: A={value_text(row.get('value_a'))}, B={value_text(row.get('value_b'))}{family}"


def config_lines(summary: Mapping[str, Any]) -> list[str]:
    """One line per changed config path (at most MAX_LINES, then how many more), then how many
    paths the ignore list left out; nothing when the configs agree and nothing was ignored."""
    rows = summary.get("config_diff") or []
    lines = [change_line(r) for r in rows[:MAX_LINES]]
    if len(rows) > MAX_LINES:
        lines.append(f"… and {len(rows) - MAX_LINES} more (summary.json, report.xlsx)")
    ignored = summary.get("config_ignored") or 0
    if ignored:
        lines.append(f"{ignored} changed path(s) left out by the config ignore list (output paths, run names, ...)")
    return lines


def console_lines(summary: Mapping[str, Any]) -> list[str]:
    """The console's lines: 'config differs: ...' per path, then 'warning: ...'."""
    lines = []
    rows = summary.get("config_diff")
    if rows:
        lines += [f"config differs: {line}" for line in config_lines(summary)]
    elif rows is not None:
        lines.append("config: the saved configs agree" + (f" ({summary['config_ignored']} ignored path(s) differ)"
                                                         if summary.get("config_ignored") else ""))
    lines += [f"warning: {w}" for w in summary.get("warnings") or []]
    return lines + [x for x in [param_line(summary)] if x]


def markdown_lines(summary: Mapping[str, Any], escape) -> list[str]:
    """summary.md's 'Config diff' section and warnings (`escape`: the Markdown escaper)."""
    lines = [f"**{escape(param_line(summary))}**", ""] if param_line(summary) else []
    for warning in summary.get("warnings") or []:
        lines += [f"**Warning:** {escape(str(warning))}", ""]
    rows = summary.get("config_diff") or []
    if rows or summary.get("config_ignored"):
        lines += ["### Config diff", ""] + [f"- `{escape(line)}`" if i < len(rows) else f"- {escape(line)}"
                                             for i, line in enumerate(config_lines(summary))] + [""]
    return lines


def xlsx_records(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Summary sheet's config diff table: every changed path with both values and its family."""
    return [{"path": r["path"], "value_a": value_text(r.get("value_a"), 1000),
             "value_b": value_text(r.get("value_b"), 1000), "family": r.get("family")}
            for r in summary.get("config_diff") or []]


# -- the parameter-update finding (rlprobe.comparison.params), one line for the console, summary.md, xlsx 
def param_line(summary: Mapping[str, Any]) -> str | None:
    """'parameter updates: ...'; None when neither run recorded fingerprints."""
    if "params_compared" not in summary:
        return None
    found = summary.get("param_first_difference")
    if found is None:
        return f"parameter updates: all {summary['params_compared']} fingerprint pairs agree"
    line = (f"parameter updates: the update of step {found['probe_step']} differs first for model "
            f"{found['monitor']!r} (first parameter {found['param']!r}, rank {found['rank']}, "
            f"norm A={found['norm_a']!r}, B={found['norm_b']!r})")
    noise = summary.get("update_noise")
    if noise is not None:  # comparison/params.py: no changed update, the optimizer's amplification of rounding
        line += (f"; rounding noise amplified by the optimizer: only the {noise['params']} of {noise['compared']} "
                 "parameters whose gradients were rounding (near zero or flipped signs) differ")
    return line
