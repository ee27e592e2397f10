"""The gradient comparison's files: grads.parquet, grad_steps.parquet and msprobe's
similarities.csv per (monitor, rank)."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path

import pyarrow as pa

from rlprobe.report.safe_cells import csv_text

KEY = ("monitor", "rank", "step", "param")


def similarities_csvs(grads: pa.Table, steps: pa.Table) -> dict[str, str]:
    """msprobe's similarities.csv per (monitor, rank): relative path -> text (UTF-8 with BOM).
    One monitor: grads/rank<R>/similarities.csv; several: grads/monitor=<name>/rank<R>/..."""
    per: dict[tuple[str, int], dict[str, dict[int, float]]] = defaultdict(dict)
    all_steps: dict[tuple[str, int], set[int]] = defaultdict(set)
    for r in grads.select([*KEY, "similarity"]).to_pylist():
        group = (r["monitor"], r["rank"])
        all_steps[group].add(r["step"])
        if r["similarity"] is not None:
            per[group].setdefault(r["param"], {})[r["step"]] = r["similarity"]
    summary: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    for r in steps.to_pylist():
        if r["weighted_similarity"] is not None:
            summary[(r["monitor"], r["rank"])][r["step"]] = r["weighted_similarity"]
    monitors = {m for m, _ in all_steps}
    files = {}
    for (monitor, rank), step_set in sorted(all_steps.items()):
        ordered = sorted(step_set)
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\r\n")  # as msprobe (pandas) writes it
        w.writerow(["step", *ordered])
        for param, values in per[(monitor, rank)].items():
            w.writerow([csv_text(param), *[_cell(values.get(s)) for s in ordered]])  # a name is never a formula
        w.writerow(["summary", *[_cell(summary[(monitor, rank)].get(s)) for s in ordered]])
        prefix = "grads" if len(monitors) == 1 else f"grads/monitor={monitor}"
        files[f"{prefix}/rank{rank}/similarities.csv"] = "\ufeff" + buf.getvalue()
    return files


def write_grad_outputs(work: Path, tables: dict[str, pa.Table]) -> list[Path]:
    """grads.parquet, grad_steps.parquet and the similarities.csv files under `work`."""
    import pyarrow.parquet as pq

    written = []
    for name in ("grads", "grad_steps"):
        written.append(work / f"{name}.parquet")
        pq.write_table(tables[name], written[-1], compression="zstd")
    for rel, text in similarities_csvs(tables["grads"], tables["grad_steps"]).items():
        path = work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="")
        written.append(path)
    return written


def _cell(value: float | None) -> str:
    return "" if value is None else repr(float(value))
