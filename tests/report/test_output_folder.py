"""The one publish rule of `rlprobe compare -o OUT` and `rlprobe pipeline run`
(rlprobe/report/output_folder.py): everything is written beside OUT and swapped in whole; a
failure keeps the previous OUT; an OUT holding files rlprobe did not write is refused (exit 3)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main
from rlprobe.pipeline.compare_command import compare
from rlprobe.report.output_folder import MANIFEST, OutputError, publish_output


def _dump(path: Path, shift: float = 0.0) -> Path:
    with rlprobe.Probe(path) as p:
        for step in range(2):
            p.save({"log_prob": np.linspace(-2, -1, 16, dtype=np.float32) + shift * step})
            p.step()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {"a": _dump(root / "a"), "b": _dump(root / "b", 1e-3)}


def _files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _beside(out: Path) -> list[str]:
    return [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp-")]


def test_plots_are_in_the_published_folder_and_nothing_is_written_after_it(runs, tmp_path):
    out = tmp_path / "out"
    compare(runs["a"], runs["b"], out, plots=True)
    pngs = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert pngs == ["key_data_heatmap.png", "key_data_max_rel_err.png"]
    listed = set(json.loads((out / MANIFEST).read_text())["files"])
    present = {p.relative_to(out).as_posix() for p in out.rglob("*")} - {MANIFEST}
    assert present == listed and "plots/key_data_heatmap.png" in listed
    # the list is the last file written into the work folder: nothing in OUT is newer
    done = (out / MANIFEST).stat().st_mtime_ns
    assert max(p.stat().st_mtime_ns for p in out.rglob("*")) <= done
    assert _beside(out) == []


def test_reports_written_by_two_threads_are_the_ones_one_thread_writes(runs, tmp_path):
    """workers=2 writes key_data.csv and report.xlsx at once (and compresses sheets on another thread):
    the files are byte for byte those of workers=1, but for the times they record."""
    import zipfile

    one, two = tmp_path / "one", tmp_path / "two"
    compare(runs["a"], runs["b"], one, workers=1)
    compare(runs["a"], runs["b"], two, workers=2)
    assert (one / "key_data.csv").read_bytes() == (two / "key_data.csv").read_bytes()
    with zipfile.ZipFile(one / "report.xlsx") as a, zipfile.ZipFile(two / "report.xlsx") as b:
        assert a.namelist() == b.namelist()
        for name in a.namelist():
            if name not in ("docProps/core.xml", "xl/worksheets/sheet1.xml"):  # times: written, elapsed
                assert a.read(name) == b.read(name), name


@pytest.mark.parametrize("workers", [2, 3])
def test_every_output_of_two_workers_is_the_one_worker_s(tmp_path, workers):
    """Runs of several keys (with workers=2 their sheets made by one filler thread beside the key-data
    files' thread, with 3 by two fillers; the later imports loaded beside the pairs): every output file
    is the one of workers=1, but for the times recorded."""
    import zipfile

    import pyarrow.parquet as pq

    keys = ("prompts", "old_log_prob", "ref_log_prob", "log_prob", "advantages", "loss")
    for name, shift in (("a", 0.0), ("b", 1e-3)):
        with rlprobe.Probe(tmp_path / name) as p:
            for step in range(3):
                values = {key: np.linspace(-2, -1, 24, dtype=np.float32) * (k + 1) for k, key in enumerate(keys)}
                values["log_prob"] = values["log_prob"] + np.float32(shift * step)  # differs from step 1 on
                p.save(values)
                p.step()
    one, two = tmp_path / "one", tmp_path / "two"
    compare(tmp_path / "a", tmp_path / "b", one, workers=1)
    compare(tmp_path / "a", tmp_path / "b", two, workers=workers)
    assert sorted(_files(one)) == sorted(_files(two))
    assert (one / "key_data.csv").read_bytes() == (two / "key_data.csv").read_bytes()
    assert pq.read_table(one / "key_data.parquet").equals(pq.read_table(two / "key_data.parquet"))
    timeless = [line for line in (one / "summary.md").read_text().splitlines() if "compared in" not in line]
    assert timeless == [line for line in (two / "summary.md").read_text().splitlines() if "compared in" not in line]
    summaries = [json.loads((out / "summary.json").read_text()) for out in (one, two)]
    for summary in summaries:
        del summary["created_at"], summary["elapsed_s"]
    assert summaries[0] == summaries[1] and summaries[0]["first_divergence"]["key"] == "log_prob"
    with zipfile.ZipFile(one / "report.xlsx") as a, zipfile.ZipFile(two / "report.xlsx") as b:
        assert a.namelist() == b.namelist()
        assert len([n for n in a.namelist() if n.startswith("xl/worksheets/")]) == 1 + len(keys)
        for name in a.namelist():
            if name not in ("docProps/core.xml", "xl/worksheets/sheet1.xml"):  # times: written, elapsed
                assert a.read(name) == b.read(name), name


def test_a_failing_csv_written_beside_the_workbook_is_reported(runs, tmp_path, monkeypatch):
    from rlprobe.report import csv_report

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(csv_report, "write_key_data_csv", broken)
    out = tmp_path / "out"
    with pytest.raises(Exception, match="No space left"):
        compare(runs["a"], runs["b"], out, workers=2)
    assert not out.exists() and _beside(out) == []


def test_a_report_that_raises_leaves_the_previous_output_as_it_was(runs, tmp_path):
    out = tmp_path / "out"
    compare(runs["a"], runs["a"], out)
    before = _files(out)

    def broken(folder: Path) -> None:
        (folder / "half.txt").write_text("half")
        raise RuntimeError("report renderer bug")

    with pytest.raises(RuntimeError, match="renderer bug"):
        compare(runs["a"], runs["b"], out, extra_files=broken)
    assert _files(out) == before and _beside(out) == []


def test_an_unwritable_file_in_the_work_folder_keeps_the_previous_output(runs, tmp_path):
    out = tmp_path / "out"
    compare(runs["a"], runs["a"], out)
    before = _files(out)

    def blocked(folder: Path) -> None:  # a real OSError from the file system
        (folder / "report.xlsx").unlink()
        (folder / "report.xlsx").mkdir()
        (folder / "report.xlsx").write_text("x")

    with pytest.raises(OutputError, match=r"cannot be written: Is a directory \(writing report.xlsx\); its earlier"):
        compare(runs["a"], runs["b"], out, extra_files=blocked)
    assert _files(out) == before and _beside(out) == []


@pytest.mark.parametrize("command", ["compare", "pipeline"])
def test_a_folder_of_other_files_is_refused_with_exit_3_and_left_untouched(runs, tmp_path, command):
    out = tmp_path / "mine"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    (out / "sub" / "data.csv").write_text("1,2")
    before = _files(out)
    if command == "compare":
        args = ["compare", str(runs["a"]), str(runs["b"]), "-o", str(out), "--quiet"]
    else:
        spec = tmp_path / "p.yaml"
        spec.write_text(f"version: 1\nname: t\nruns: {{a: '{runs['a']}', b: '{runs['b']}'}}\noutput: '{out}'\n")
        args = ["pipeline", "run", str(spec), "--quiet"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 3, result.output
    assert "holdsotherfiles" in "".join(result.output.split())  # compared without spaces: wrapped at any width
    assert _files(out) == before and _beside(out) == []


def test_a_file_added_to_an_rlprobe_output_is_refused_not_deleted(runs, tmp_path):
    out = tmp_path / "out"
    compare(runs["a"], runs["b"], out)
    (out / "plots").mkdir()
    (out / "plots" / "my_notes.md").write_text("look at step 1")
    before = _files(out)
    with pytest.raises(OutputError, match=r"holds other files \(not written by rlprobe: plots, plots/my_notes.md\)"):
        compare(runs["a"], runs["b"], out)
    assert _files(out) == before


def test_an_output_of_an_earlier_rlprobe_without_a_file_list_is_replaced(runs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")  # rlprobe before the file list wrote summary.json
    (out / "report.xlsx").write_text("old")
    compare(runs["a"], runs["b"], out, reports=False)
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "key_data.parquet", "summary.json"]


def test_publish_output_refuses_a_file_and_names_it(tmp_path):
    target = tmp_path / "taken"
    target.write_text("x")
    with pytest.raises(OutputError, match=r"output .*taken is a file; give a directory"):
        publish_output(target, lambda folder: None)
    assert target.read_text() == "x"
