"""The config diff and the warnings of a comparison as the console, summary.md and the xlsx
Summary show them (the summary's config_diff, config_cause, config_ignored and warnings; they
are computed by rlprobe.comparison.config_diff), and the parameter-update finding as one line
(param_line: the summary's param_first_difference, by rlprobe.comparison.params)."""

from __future__ import annotations

from typing import Any, Mapping

from rlprobe.lake.configs import value_text

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
