"""The files of a comparison's output folder, rendered from the tables and summary that
rlprobe.compare returns (`rlprobe compare` and pipelines write the same ones): key_data.parquet,
modules.parquet, grads.parquet, grad_steps.parquet, grads/.../similarities.csv, summary.json,
key_data.csv, summary.md, report.xlsx, per-key workbooks and plots/.

The gradient comparison's files (write_grad_outputs): grads.parquet, grad_steps.parquet and msprobe's
similarities.csv per (monitor, rank).
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import tempfile
import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from rlprobe.report.safe_cells import csv_text

# columns the reports leave out: file paths and ordering helpers of the comparison
KEY_DATA_PRIVATE = ("file_a", "file_b", "canonical_key", "flow_position", "control_envelope")
MODULES_PRIVATE = ("file_a", "file_b", "io_order")
# the Grad flags sheet's columns: why a row is flagged (`flagged` also puts flagged rows first
# when the sheet is capped); the raw max/min/zero fractions of both runs stay in grads.parquet
# (the sheet took 2/3 of report.xlsx's time with them)
GRAD_FLAG_COLUMNS = ("monitor", "rank", "step", "param", "status", "shape_a", "shape_b", "numel", "similarity",
                     "prev_similarity", "flagged", "flag_reason", "norm_a", "norm_b", "norm_rel_diff", "max_abs_diff",
                     "min_abs_diff", "digest_equal", "probe_step_a", "probe_step_b", "message")


@dataclass
class ReportOptions:
    """Which report files to write: workbook, CSV and Markdown in `lang`; `summary_md`: the text of
    summary.md (None: the comparison's own); per-key workbooks under `per_key_dir`; PNG plots.
    `workers` > 1: the CSV and the workbook are written at once: the key-data files by one thread, the
    workbook's sheets made by the other `workers` - 1 and compressed by one more while the next is made
    (most of the work is pyarrow.compute and zlib, which release the GIL)."""

    lang: str = "en"
    xlsx: bool = True
    csv: bool = True
    markdown: bool = True
    summary_md: str | None = None
    per_key_dir: str | None = None
    plots: bool = False
    plot_every_param: bool = False
    workers: int = 1


def write_tables(folder: Path, tables: dict[str, pa.Table], *, key_data: bool = True) -> dict[str, Any]:
    """key_data.parquet (unless `key_data` is false: write_reports then writes it) and the module and
    gradient comparisons that ran: modules.parquet, grads.parquet, grad_steps.parquet,
    grads/.../similarities.csv and params.parquet. Returns the keyword arguments of write_report_xlsx
    that add their sheets."""
    if key_data:
        write_key_data_parquet(folder, tables["key_data"])
    extra_sheets: dict[str, pa.Table] = {}
    if "modules" in tables:
        extra_sheets["Modules"] = _without(tables["modules"], MODULES_PRIVATE)
        pq.write_table(extra_sheets["Modules"], folder / "modules.parquet", compression="zstd")
    if "grads" in tables:
        import pyarrow.compute as pc

        write_grad_outputs(folder, tables)
        extra_sheets["Grads"] = tables["grad_steps"]
        grads = tables["grads"]  # the Grad flags sheet: flagged rows and parameters on one side only
        noted = pc.or_kleene(pc.fill_null(grads["flagged"], False),
                             pc.invert(pc.is_in(grads["status"], pa.array(["compared", "stats_only"]))))
        extra_sheets["Grad flags"] = grads.filter(pc.fill_null(noted, True)).select(
            [c for c in GRAD_FLAG_COLUMNS if c in grads.column_names])
    if "module_weights" in tables:  # the weights at module dumps (docs/modules.md, "Weights at the call")
        pq.write_table(tables["module_weights"], folder / "module_weights.parquet", compression="zstd")
    if "params" in tables:  # parameter fingerprints (docs/compare.md, "Parameter updates"): the sheet shows
        import pyarrow.compute as pc  # the pairs that do not match, params.parquet every pair

        params = tables["params"]
        pq.write_table(params, folder / "params.parquet", compression="zstd")
        extra_sheets["Param updates"] = params.filter(pc.invert(pc.is_in(params["status"], pa.array(["match"]))))
    return {"extra_sheets": extra_sheets,
            "extra_files": {"Modules": "modules.parquet", "Grads": "grad_steps.parquet", "Grad flags": "grads.parquet",
                            "Param updates": "params.parquet"},
            "grad_matrix": (tables["grads"], tables["grad_steps"]) if "grads" in tables else None}


def write_key_data_parquet(folder: Path, key_data: pa.Table) -> None:
    pq.write_table(key_data, folder / "key_data.parquet", compression="zstd")


def write_summary_json(folder: Path, summary: dict[str, Any]) -> None:
    (folder / "summary.json").write_text(json.dumps(jsonable(summary), indent=2, allow_nan=False) + "\n",
                                         encoding="utf-8")


def write_reports(folder: Path, tables: dict[str, pa.Table], summary: dict[str, Any], xlsx_extras: dict[str, Any],
                  options: ReportOptions, *, key_data_parquet: bool = False,
                  rendered: "KeyDataFiles | None" = None) -> None:
    """key_data.csv, report.xlsx, summary.md, the per-key workbooks and the plots, as `options` say;
    with `key_data_parquet`, key_data.parquet too (write_tables(key_data=False) left it out), or, given
    `rendered` (KeyDataFiles, below), both key_data files as it rendered them. With `options.workers` > 1
    and a workbook, key_data.parquet and key_data.csv are written by a thread beside it (Arrow's
    Parquet writer, pyarrow.compute and zlib release the GIL)."""
    public = public_key_data(tables["key_data"])
    beside = []  # key_data.parquet, key_data.csv: (function, arguments, keywords)
    if rendered is not None:
        beside.append((rendered.write, (folder,), {}))
    elif key_data_parquet:
        beside.append((write_key_data_parquet, (folder, tables["key_data"]), {}))
    if options.csv and rendered is None:
        from rlprobe.report.csv_report import write_key_data_csv

        beside.append((write_key_data_csv, (folder / "key_data.csv", public), {"lang": options.lang}))
    side_writer = None
    if options.workers > 1 and options.xlsx and beside:
        from concurrent.futures import ThreadPoolExecutor

        side_writer = ThreadPoolExecutor(1, thread_name_prefix="rlprobe-csv")
        side_done = [side_writer.submit(write, *args, **kwargs) for write, args, kwargs in beside]
    else:
        for write, args, kwargs in beside:
            write(*args, **kwargs)
    try:
        if options.xlsx:
            from rlprobe.report.xlsx import write_report_xlsx

            # the files beside take one of the workers: the sheets get the others (two fillers beside the
            # CSV on two cores spent ~0.1 s more CPU than one, in no less time: docs/compare.md)
            fillers = max(1, options.workers - (side_writer is not None))
            write_report_xlsx(folder / "report.xlsx", public, summary, lang=options.lang,
                              background=options.workers > 1, fillers=fillers, **xlsx_extras)
    finally:
        if side_writer is not None:
            side_writer.shutdown()  # waits for the files beside the workbook
    if side_writer is not None:
        for done in side_done:
            done.result()  # its error, if any
    if options.markdown:
        from rlprobe.report.markdown import render_summary_md

        text = options.summary_md if options.summary_md is not None else render_summary_md(summary, public)
        (folder / "summary.md").write_text(text, encoding="utf-8")
    if options.per_key_dir:
        from rlprobe.report.xlsx import write_per_key_xlsx

        write_per_key_xlsx(folder / options.per_key_dir, public, lang=options.lang)
    if options.plots or options.plot_every_param:
        write_plots_of(folder, every_param=options.plot_every_param)


def write_plots_of(folder: Path, every_param: bool) -> None:
    """plots/ from the tables already in `folder`; a failure names the plots."""
    from rlprobe.report.plots import write_plots

    try:
        write_plots(folder, every_param=every_param)
    except OSError as e:
        if e.errno is None:
            raise OSError(f"the plots cannot be written: {e}") from e
        raise OSError(e.errno, f"the plots cannot be written: {e.strerror}", e.filename) from e


def public_key_data(key_data: pa.Table) -> pa.Table:
    """key_data as the reports show it: without the internal file and ordering columns."""
    return _without(key_data, KEY_DATA_PRIVATE)


def jsonable(value: Any) -> Any:
    """Strict JSON: non-finite floats become the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _without(table: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    return table.drop_columns([c for c in columns if c in table.column_names])


# key_data.parquet and key_data.csv rendered by a thread as soon as the comparison has its key_data table, while
# it still runs the verdict's queries and the later comparisons (`rlprobe compare --workers 2`:
# rlprobe.comparison.run.compare_dumps's `key_data_ready`); write_reports then only copies them into the output
# folder. They are the bytes write_key_data_parquet and write_key_data_csv write, rendered into unnamed temporary
# files, not memory: key_data.csv is ~350 bytes a pair (issue 42, item 6).
class KeyDataFiles:
    """`start(key_data)` renders the files on a thread; `write(folder)` waits for it and writes them
    (raising its error, if rendering failed). key_data.csv in `lang`, unless `csv` is false."""

    def __init__(self, lang: str = "en", csv: bool = True) -> None:
        self._lang = lang
        self._csv = csv
        self._thread: threading.Thread | None = None
        self._files: dict[str, BinaryIO] = {}  # name -> its rendered bytes, in a temporary file
        self._error: BaseException | None = None

    def start(self, key_data: pa.Table) -> None:
        # imported here, on the calling thread, which may import other modules while the thread renders:
        # no two threads in one import cycle (as rlprobe.comparison.run's later imports)
        from rlprobe.report import csv_report  # noqa: F401

        self._thread = threading.Thread(target=self._render, args=(key_data,), name="rlprobe-key-data-files",
                                        daemon=True)
        self._thread.start()

    def _render(self, key_data: pa.Table) -> None:
        from rlprobe.report.csv_report import key_data_csv_writer

        try:
            self._files["key_data.parquet"] = parquet = tempfile.TemporaryFile()
            pq.write_table(key_data, parquet, compression="zstd")
            if self._csv:
                self._files["key_data.csv"] = text = tempfile.TemporaryFile()
                key_data_csv_writer(public_key_data(key_data), self._lang)(text)
        except BaseException as exc:  # noqa: BLE001 - raised again by write(), in the writing thread
            self._error = exc

    def write(self, folder: Path) -> None:
        if self._thread is None:
            raise RuntimeError("KeyDataFiles.write before start: the comparison never handed over key_data")
        self._thread.join()
        try:
            if self._error is not None:
                raise self._error
            parquet = self._files["key_data.parquet"]
            parquet.seek(0)
            with open(folder / "key_data.parquet", "wb") as f:
                shutil.copyfileobj(parquet, f, 1 << 20)
            if "key_data.csv" in self._files:
                from rlprobe.report import csv_report

                csv_report.write_key_data_csv(folder / "key_data.csv", None, self._lang,
                                              rendered=self._files["key_data.csv"])
        finally:
            for rendered in self._files.values():
                rendered.close()


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
