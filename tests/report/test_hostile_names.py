"""Every xlsx and CSV file rlprobe writes, from real dumps whose names would run as formulas:
keys, index values, gradient monitors, parameters, modules, stages and run paths."""

from __future__ import annotations

import csv
import zipfile
from pathlib import Path

import openpyxl
import pytest
import torch
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main
from rlprobe.compat.msprobe import GradComparator, SingleComparator
from rlprobe.report.safe_cells import FORMULA_TRIGGERS, is_formula_like

KEY = "=cmd|' -C calc'!A0"
ONLY_IN_B = "@SUM(A1)"
INDEX = "+HYPERLINK(\"http://x\")"
MONITOR = "=1+1"
MODULES = ("=2+2", "-3+4")  # parameters: =2+2.weight, =2+2.bias, -3+4.weight, -3+4.bias
STAGE = "-cmd|' /C notepad'!A0"
RUN_A, RUN_B = "=A1+1", "@B"  # directories given as relative paths: the summary's run_a/run_b


def _run(path: Path, bump: float) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module(MODULES[0], torch.nn.Linear(4, 3))
    model.add_module("tanh", torch.nn.Tanh())
    model.add_module(MODULES[1], torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    with rlprobe.Probe(path) as probe:
        probe.monitor_grads(model, optimizer=opt, name=MONITOR, level="L2")
        for step in range(2):
            x = torch.randn(5, 4, generator=g) + bump * step
            with probe.stage(STAGE, model=model, tensors=True):
                out = model(x)
            data = {KEY: out.detach(), "responses": {INDEX: x, "plain": x * 2}}
            if bump:
                data[ONLY_IN_B] = x
            probe.save(data)
            opt.zero_grad()
            out.pow(2).mean().backward()
            opt.step()
            probe.step()
    return path


def _cells(root: Path) -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """(text of every xlsx cell by workbook sheet "file:sheet", every CSV field) under `root`,
    asserting on the way that no cell is a formula and formula-like text is marked as text."""
    sheets: dict[str, list[tuple[str, str]]] = {}
    books = sorted(root.rglob("*.xlsx"))
    for book in books:
        with zipfile.ZipFile(book) as z:
            for name in z.namelist():
                assert b"<f>" not in z.read(name) and b"<f " not in z.read(name), (book, name)
        for ws in openpyxl.load_workbook(book):
            texts = sheets.setdefault(f"{book.relative_to(root)}:{ws.title}", [])
            for row in ws.iter_rows():
                for cell in row:
                    assert cell.data_type != "f", (book, ws.title, cell.coordinate, cell.value)
                    if isinstance(cell.value, str):
                        if cell.value.startswith(FORMULA_TRIGGERS):
                            assert cell.data_type == "s" and cell.quotePrefix, (book, ws.title, cell.coordinate,
                                                                                cell.value)
                        texts.append((cell.coordinate, cell.value))
    fields = []
    for path in sorted(root.rglob("*.csv")):
        with open(path, encoding="utf-8-sig", newline="") as f:
            for row in csv.reader(f):
                for field in row:
                    assert not is_formula_like(field), (path, row)
                    fields.append(field)
    return sheets, fields


def _texts(sheets: dict[str, list[tuple[str, str]]], suffix: str) -> set[str]:
    return {text for name, cells in sheets.items() if name.endswith(suffix) for _, text in cells}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    _run(root / RUN_A, 0.0)
    _run(root / RUN_B, 0.5)
    return root


def test_no_sheet_or_csv_of_a_comparison_holds_a_formula(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(runs)
    out = tmp_path / "out"
    summary = rlprobe.compare(RUN_A, RUN_B, out, per_key_files=True)
    assert summary["run_a"] == RUN_A and summary["first_divergence"] is not None
    sheets, fields = _cells(out)
    names = {name.split(":", 1)[1] for name in sheets if name.startswith("report.xlsx:")}
    assert {"Summary", "Modules", "Grads", "Grad flags", "Grad similarity", "responses"} <= names
    assert sum(1 for n in sheets if n.startswith("per_key")) == 3  # KEY, ONLY_IN_B, responses
    params = {f"{m}.{p}" for m in MODULES for p in ("weight", "bias")}
    # the names are there, as text: the test sees what a writer that skipped them would write
    assert {MONITOR} | params <= _texts(sheets, ":Grad similarity")
    assert MONITOR in _texts(sheets, ":Grads") and params & _texts(sheets, ":Grad flags")
    assert {STAGE, *MODULES} <= _texts(sheets, ":Modules")
    assert {RUN_A, RUN_B, KEY} <= _texts(sheets, "report.xlsx:Summary")
    assert {KEY, ONLY_IN_B, INDEX} <= _texts(sheets, "")  # key sheets, per-key files
    # CSV: key_data.csv and msprobe's similarities.csv, formula-like text after an apostrophe
    assert {"'" + KEY, "'" + ONLY_IN_B, "'" + INDEX} <= set(fields)
    assert {"'" + p for p in params} <= set(fields)


def test_msprobe_compatible_outputs_hold_no_formula(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(runs)
    SingleComparator.compare(RUN_A, RUN_B, str(tmp_path / "single"))
    sheets, _ = _cells(tmp_path / "single")
    assert {KEY, ONLY_IN_B} <= {name.split(".xlsx")[0] for name in sheets} | _texts(sheets, "")
    GradComparator.compare_distributed(RUN_A, RUN_B, str(tmp_path / "grad"))
    _, fields = _cells(tmp_path / "grad")
    assert (tmp_path / "grad" / "rank0" / "similarities.csv").is_file()
    assert "'" + MODULES[0] + ".weight" in fields


def test_pipeline_reports_hold_no_formula(runs, tmp_path):
    spec = tmp_path / "p.yaml"
    spec.write_text(f"version: 1\nname: hostile\nruns: {{a: '{runs / RUN_A}', b: '{runs / RUN_B}'}}\n"
                    f"output: '{tmp_path / 'out'}'\ncompare: {{grads: {{}}}}\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["pipeline", "run", str(spec), "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    sheets, fields = _cells(tmp_path / "out")
    assert MONITOR in _texts(sheets, ":Grad similarity") and "'" + KEY in fields


def test_sql_csv_output_guards_text_and_writes_lists(runs, tmp_path):
    target = tmp_path / "q.csv"
    result = CliRunner().invoke(main, ["sql", str(runs / RUN_B), "SELECT key, index, shape, key AS \"=h\" "
                                       "FROM key_data ORDER BY key, index, step", "--format", "csv",
                                       "-o", str(target)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    _, fields = _cells(tmp_path)
    assert fields[:4] == ["key", "index", "shape", "'=h"]
    assert fields[4:8] == ["'" + KEY, "", "[5, 2]", "'" + KEY]
    assert "'" + INDEX in fields and "'" + ONLY_IN_B in fields
