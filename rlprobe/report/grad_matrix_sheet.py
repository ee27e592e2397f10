"""The "Grad similarity" sheet of report.xlsx: msprobe's similarities.csv as a styled matrix."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from rlprobe.report.headers import header
from rlprobe.report.workbook import FILLS, CellFormat, Workbook

MAX_COLUMNS = 16_384  # columns per sheet in Excel


def write_grad_matrix(book: Workbook, name: str, grads: pa.Table, steps: pa.Table, *, lang: str,
                      max_rows: int) -> None:
    """Sign similarity as msprobe's similarities.csv lays it out: a row per (monitor, rank,
    parameter), a column per step, then a "(weighted)" row per (monitor, rank) with the step's
    element-weighted similarity. Flagged cells are red; a parameter missing or reshaped on one
    side shows its status in amber. Numbers are written unstyled (cheap), so a sheet of
    hundreds of parameters x thousands of steps stays a few seconds of openpyxl."""
    rows = grads.select(["monitor", "rank", "step", "param", "status", "similarity", "flagged"]).to_pylist()
    all_steps = sorted({r["step"] for r in rows})
    kept_steps = all_steps[: MAX_COLUMNS - 3]
    column = {s: 3 + i for i, s in enumerate(kept_steps)}
    params: dict[tuple[str, int], dict[str, list[Any]]] = {}
    flags: dict[tuple[str, int, str], dict[int, bool]] = {}  # cell column -> flagged (else: one side only)
    for r in rows:
        group = params.setdefault((r["monitor"], r["rank"]), {})
        cells = group.get(r["param"])
        if cells is None:
            cells = group[r["param"]] = [r["monitor"], r["rank"], r["param"]] + [None] * len(kept_steps)
        j = column.get(r["step"])
        if j is None:
            continue
        if r["similarity"] is not None:
            cells[j] = r["similarity"]
        elif r["status"] not in ("compared", "stats_only"):
            cells[j] = r["status"]
        if r["flagged"] or r["status"] not in ("compared", "stats_only"):
            flags.setdefault((r["monitor"], r["rank"], r["param"]), {})[j] = bool(r["flagged"])
    weighted = {(r["monitor"], r["rank"], r["step"]): r["weighted_similarity"]
                for r in steps.select(["monitor", "rank", "step", "weighted_similarity"]).to_pylist()}
    step_flags = {(r["monitor"], r["rank"], r["step"])
                  for r in steps.select(["monitor", "rank", "step", "flagged"]).to_pylist() if r["flagged"]}
    head = book.style(CellFormat(bold=True, fill=FILLS["header"]))
    bad = book.style(CellFormat(fill=FILLS["bad"]))
    missing = book.style(CellFormat(fill=FILLS["missing"]))
    bold = book.style(CellFormat(bold=True))
    bold_bad = book.style(CellFormat(bold=True, fill=FILLS["bad"]))
    longest = max([len(str(p)) for group in params.values() for p in group] + [12])
    ws = book.add_sheet(name, [12, 6, min(60, longest + 2)] + [9] * len(kept_steps), freeze="D2")
    ws.append([header("monitor", lang), header("rank", lang), header("param", lang), *kept_steps], head)
    written = 0
    for (monitor, rank), group in params.items():
        for param, cells in group.items():
            if written >= max_rows:
                break
            marked = flags.get((monitor, rank, param))
            styles = None
            if marked:
                styles = [None] * len(cells)
                for j, flagged in marked.items():
                    styles[j] = bad if flagged else missing
            ws.append(cells, styles)
            written += 1
        summary_row = [monitor, rank, "(weighted)"] + [weighted.get((monitor, rank, s)) for s in kept_steps]
        styles = [bold] * 3 + [bold_bad if (monitor, rank, s) in step_flags else bold for s in kept_steps]
        ws.append(summary_row, styles)
    total = sum(len(g) for g in params.values())
    notes = []
    if written < total:
        notes.append(f"{written} of {total} parameter rows shown; grads.parquet has all")
    if len(kept_steps) < len(all_steps):
        notes.append(f"steps {kept_steps[0]}-{kept_steps[-1]} of {all_steps[0]}-{all_steps[-1]} shown "
                     "(Excel's column limit); grads.parquet has all")
    if notes:
        ws.blank_row()
        ws.append(["; ".join(notes)], bold)
