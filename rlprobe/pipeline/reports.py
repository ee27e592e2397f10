"""What a pipeline run adds to the comparison reports: JUnit XML (one test case per gate) and
the Markdown summary with the failing gates' first rows, fit for a CI comment."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa

from rlprobe.report.markdown import escape_md, render_summary_md, table

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
