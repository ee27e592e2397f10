"""rlprobe/report/comparison_files.py (KeyDataFiles): key_data.parquet and key_data.csv rendered before the output
folder exists are the files the writers write, and a rendering error reaches the writer."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from rlprobe.errors import ProbeError
from rlprobe.report.comparison_files import public_key_data, write_key_data_parquet
from rlprobe.report.csv_report import write_key_data_csv
from rlprobe.report.comparison_files import KeyDataFiles


def _key_data() -> pa.Table:
    return pa.table({"key": ["log_prob", "=cmd", None], "step": [0, 1, 2], "max_abs_err": [0.0, float("nan"), 1e-7],
                     "shape_a": [[4, 16], [], None], "file_a": ["x.npy", "y.npy", ""],
                     "message": ['a "quoted", text', "", None]})


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_rendered_files_are_the_written_ones(tmp_path: Path, lang: str):
    key_data = _key_data()
    direct, rendered = tmp_path / "direct", tmp_path / "rendered"
    direct.mkdir()
    rendered.mkdir()
    write_key_data_parquet(direct, key_data)
    write_key_data_csv(direct / "key_data.csv", public_key_data(key_data), lang=lang)
    files = KeyDataFiles(lang)
    files.start(key_data)
    files.write(rendered)
    assert sorted(p.name for p in rendered.iterdir()) == ["key_data.csv", "key_data.parquet"]
    for name in ("key_data.csv", "key_data.parquet"):
        assert (rendered / name).read_bytes() == (direct / name).read_bytes(), name


def test_without_csv_only_the_parquet_file(tmp_path: Path):
    files = KeyDataFiles(csv=False)
    files.start(_key_data())
    files.write(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["key_data.parquet"]


def test_a_rendering_error_is_raised_by_write(tmp_path: Path):
    files = KeyDataFiles(lang="fr")  # no such report language: the CSV's headers fail
    files.start(_key_data())
    with pytest.raises(ProbeError, match="fr"):
        files.write(tmp_path)


def test_write_before_start_is_refused(tmp_path: Path):
    with pytest.raises(RuntimeError, match="before start"):
        KeyDataFiles().write(tmp_path)
