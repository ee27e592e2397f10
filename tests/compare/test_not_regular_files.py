"""`rlprobe compare` of a dump in which a FIFO (named pipe) or a link to /dev/zero stands in place of a file it
reads (rlprobe/lake/regular_files.py): opening the FIFO waited for a writer forever, and the command hung. Now a
tensor file (a whole .npy, a packed .npys) becomes an error row naming it, whether its pair is compared alone
(fewer than 16 pairs) or in a batch of the compiled reader; a stats part is a read error and an error row; a
rank manifest or an msprobe statistics file makes the run unreadable (exit 3) and a config file is left out,
each named, as a corrupt one is. Other commands: tests/lake/test_regular_files.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main
from rlprobe.errors import DumpReadError
from rlprobe.pipeline.compare_command import compare
from tests.lake.fifos import fifo_in_place_of, finishes, zero_device_in_place_of
from tests.lake.layouts import unpack

pytestmark = pytest.mark.timeout(300)  # finishes() fails a comparison that waits on a FIFO long before this

KINDS = {"fifo": "a FIFO", "device": "a character device"}


def _msprobe(path: Path, keys: int, shift: float = 0.0) -> Path:
    """An msprobe SingleSave dump: a .npy and msprobe's statistics .json a key, step 0."""
    for k in range(keys):
        folder = path / "data" / f"k{k}" / "step0" / "rank0" / "micro_step0"
        folder.mkdir(parents=True)
        x = np.linspace(-1, 1, 64, dtype=np.float32) + shift
        np.save(folder / f"k{k}.npy", x)
        stats = {"max": float(x.max()), "min": float(x.min()), "mean": float(x.mean()),
                 "norm": float(np.linalg.norm(x)), "shape": [64]}
        (folder / f"k{k}.json").write_text(json.dumps({"data": stats}))
    (path / "configurations.json").write_text(json.dumps({"lr": 0.1}))
    return path


def _rlprobe(path: Path, keys: int, shift: float = 0.0) -> Path:
    with rlprobe.Probe(path) as p:
        p.save_config({"lr": 0.1})
        for _ in range(2):
            p.save({f"k{k}": np.linspace(-1, 1, 64, dtype=np.float32) + shift for k in range(keys)})
            p.step()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Each format's run A and run B (B's values shifted), with 2 keys (pairs compared one by one) and with
    20 (batches of the compiled reader, from 16 pairs on)."""
    root = tmp_path_factory.mktemp("runs")
    return {f"{fmt}{keys}{side}": make(root / f"{fmt}{keys}{side}", keys, 0.5 if side == "b" else 0.0)
            for fmt, make in (("msprobe", _msprobe), ("rlprobe", _rlprobe)) for keys in (2, 20) for side in "ab"}


def _copy(runs: dict[str, Path], name: str, tmp_path: Path) -> Path:
    path = tmp_path / name
    shutil.copytree(runs[name], path, symlinks=True)
    return path


def _error_messages(out: Path) -> set[str]:
    return {r["message"] for r in pq.read_table(out / "key_data.parquet").to_pylist() if r["status"] == "error"}


@pytest.mark.parametrize("keys", [2, 20])
@pytest.mark.parametrize("replaced", list(KINDS))
def test_an_msprobe_tensor_file_is_an_error_row_naming_it(runs, tmp_path, replaced, keys):
    a = _copy(runs, f"msprobe{keys}a", tmp_path)
    bad = (fifo_in_place_of if replaced == "fifo" else zero_device_in_place_of)(
        a / "data" / "k1" / "step0" / "rank0" / "micro_step0" / "k1.npy")
    summary = finishes(lambda: compare(a, runs[f"msprobe{keys}b"], tmp_path / "out"), [bad])
    assert summary["counts"] == {"error": 1, "mismatch": keys - 1}
    assert _error_messages(tmp_path / "out") == {
        f"cannot read {bad}: not a regular file ({KINDS[replaced]}); expected a .npy tensor file"}


@pytest.mark.parametrize("keys", [2, 20])
@pytest.mark.parametrize("replaced", list(KINDS))
def test_a_packed_tensor_file_makes_each_of_its_pairs_an_error_row_naming_it(runs, tmp_path, replaced, keys):
    a = _copy(runs, f"rlprobe{keys}a", tmp_path)
    packs = sorted((a / "tensors" / "key_data" / "rank=0").glob("*.npys"))  # both steps' records: one file, or two
    for pack in packs:
        (fifo_in_place_of if replaced == "fifo" else zero_device_in_place_of)(pack)
    summary = finishes(lambda: compare(a, runs[f"rlprobe{keys}b"], tmp_path / "out"), packs)
    assert summary["counts"] == {"error": 2 * keys}
    assert _error_messages(tmp_path / "out") == {
        f"cannot read {pack}: not a regular file ({KINDS[replaced]}); expected a packed .npys tensor file"
        for pack in packs}


def test_a_whole_npy_file_of_an_rlprobe_dump_is_an_error_row_naming_it(runs, tmp_path):
    a = _copy(runs, "rlprobe20a", tmp_path)
    unpack(a)  # a .npy file a tensor, as dumps were written before packed files
    bad = fifo_in_place_of(next((a / "tensors" / "key_data").rglob("k3.npy")))
    summary = finishes(lambda: compare(a, runs["rlprobe20b"], tmp_path / "out"), [bad])
    assert summary["counts"] == {"error": 1, "mismatch": 39}
    assert _error_messages(tmp_path / "out") == {
        f"cannot read {bad}: not a regular file (a FIFO); expected a .npy tensor file"}


@pytest.mark.parametrize("side", ["a", "b"])
def test_a_stats_part_is_a_read_error_and_an_error_row(runs, tmp_path, side):
    bad_run = _copy(runs, f"rlprobe2{side}", tmp_path)
    (part,) = (bad_run / "stats" / "key_data" / "rank=0").glob("part-*.parquet")
    fifo_in_place_of(part)
    a, b = (bad_run, runs["rlprobe2b"]) if side == "a" else (runs["rlprobe2a"], bad_run)
    summary = finishes(lambda: compare(a, b, tmp_path / "out"), [part])
    message = (f"{part}: unreadable Parquet part (not a regular file (a FIFO); expected a Parquet stats part); "
               "its rows are missing from this dump")
    assert summary["read_errors"] == [f"run {side.upper()}: {message}"]
    assert summary["counts"] == {"error": 1, f"only_in_{'b' if side == 'a' else 'a'}": 4}
    assert summary["first_divergence"]["key"] == "(unreadable stats)"


@pytest.mark.parametrize("fmt", ["msprobe", "rlprobe"])
def test_a_config_file_is_left_out_and_named(runs, tmp_path, fmt):
    a = _copy(runs, f"{fmt}2a", tmp_path)
    config = fifo_in_place_of(a / "configurations.json")
    summary = finishes(lambda: compare(a, runs[f"{fmt}2b"], tmp_path / "out"), [config])
    assert summary["read_errors"] == [f"run A: {config}: unreadable JSON (not a regular file (a FIFO); "
                                      "expected a JSON file); left out of configs"]
    assert summary["counts"] == {"mismatch": 2 if fmt == "msprobe" else 4}


@pytest.mark.parametrize("fmt", ["msprobe", "rlprobe"])
def test_a_run_whose_statistics_file_or_rank_manifest_cannot_be_read_is_exit_3_naming_it(runs, tmp_path, fmt):
    a = _copy(runs, f"{fmt}2a", tmp_path)
    if fmt == "msprobe":
        bad = fifo_in_place_of(a / "data" / "k0" / "step0" / "rank0" / "micro_step0" / "k0.json")
        message = f"{bad}: not a regular file (a FIFO); expected msprobe's statistics .json file"
    else:
        bad = fifo_in_place_of(a / "rank0.json")
        message = f"{bad}: unreadable JSON (not a regular file (a FIFO); expected a JSON file)"
    with pytest.raises(DumpReadError) as error:
        finishes(lambda: compare(a, runs[f"{fmt}2b"], tmp_path / "out"), [bad])
    assert str(error.value) == message
    result = finishes(lambda: CliRunner().invoke(main, ["compare", str(a), str(runs[f"{fmt}2b"]), "-o",
                                                        str(tmp_path / "out")]), [bad])
    assert result.exit_code == 3 and " ".join(result.output.split()) == f"error: {message}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("statistics", [True, False], ids=["with its statistics", "without statistics"])
def test_the_command_names_the_fifo_of_a_tiny_dump(runs, tmp_path, statistics):
    """The report's reproduction: a dump of one tensor, whose .npy is a FIFO; without msprobe's statistics
    .json beside it, its shape is unknown, and its pair was a stats_only_match ("no divergence")."""
    a, b = _copy(runs, "msprobe2a", tmp_path), _copy(runs, "msprobe2b", tmp_path / "b")
    for run in (a, b):
        shutil.rmtree(run / "data" / "k1")
        if not statistics:
            (run / "data" / "k0" / "step0" / "rank0" / "micro_step0" / "k0.json").unlink()
    bad = fifo_in_place_of(a / "data" / "k0" / "step0" / "rank0" / "micro_step0" / "k0.npy")
    result = finishes(lambda: CliRunner().invoke(main, ["compare", str(a), str(b), "-o", str(tmp_path / "out")]),
                      [bad])
    output = " ".join(result.output.split())
    assert result.exit_code == 0 and f"compared {a} (A) with {b} (B): 1 error " in output, output
    assert f"cannot read {bad}: not a regular file (a FIFO); expected a .npy tensor file" in output


@pytest.mark.parametrize("content", [b"", b"not a numpy file"], ids=["empty", "garbage"])
def test_an_unreadable_npy_without_statistics_is_an_error_row_not_a_match(runs, tmp_path, content):
    """Its shape unknown (no statistics .json, no header), the pair is still compared (sql/tensor_pairs.sql), so
    the read names the file; it was left to the statistics, missing on both sides: stats_only_match."""
    a, b = _copy(runs, "msprobe2a", tmp_path), _copy(runs, "msprobe2b", tmp_path / "b")
    for run in (a, b):
        for json_file in run.rglob("*.json"):
            json_file.unlink()
    bad = a / "data" / "k0" / "step0" / "rank0" / "micro_step0" / "k0.npy"
    bad.write_bytes(content)
    summary = compare(a, b, tmp_path / "out")
    assert summary["counts"] == {"error": 1, "mismatch": 1}
    (message,) = _error_messages(tmp_path / "out")
    assert message.startswith(f"cannot read {bad}: ")


def test_a_sign_map_of_an_msprobe_grad_dump_is_that_parameter_s_error(fixtures_dir, tmp_path):
    grad = fixtures_dir / "msprobe" / "grad"
    a = tmp_path / "run_a"
    shutil.copytree(grad / "run_a", a)
    bad = fifo_in_place_of(a / "rank0" / "step1" / "2.weight.npy")
    finishes(lambda: compare(a, grad / "run_b", tmp_path / "out"), [bad])
    rows = [r for r in pq.read_table(tmp_path / "out" / "grads.parquet").to_pylist() if r["status"] == "error"]
    assert [(r["step"], r["param"], r["message"]) for r in rows] == [
        (1, "2.weight", f"sign maps of '2.weight' step 1: {bad}: not a regular file (a FIFO); "
                        "expected a .npy file of gradient signs")]
