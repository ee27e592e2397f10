"""A FIFO (named pipe), a device or a directory in place of a dump's file is named, never read
(rlprobe/lake/regular_files.py): opening a FIFO for reading waited for a writer forever, so `rlprobe info`,
`sql`, `compact`, `import-msprobe` and rlprobe.open's readers hung. Each reader now reports it as it reports
a file it cannot read. Comparisons: tests/compare/test_not_regular_files.py; `rlprobe check`:
tests/check/test_mapped_tensors.py."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main
from rlprobe.errors import DumpReadError, ProbeError
from rlprobe.lake.regular_files import NPY, NotRegularFileError, check_regular, load_npy, open_binary, open_fd, \
    read_text
from tests.lake.fifos import fifo_in_place_of, finishes, zero_device_in_place_of
from tests.cli_runs import cli as _cli
from tests.lake.small_dumps import small_dump

pytestmark = pytest.mark.timeout(300)  # a call that waits on a FIFO fails in finishes(), or here


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return small_dump(tmp_path_factory.mktemp("good") / "dump", steps=2)


@pytest.fixture
def dump(good, tmp_path) -> Path:
    path = tmp_path / "dump"
    shutil.copytree(good, path)
    return path


def _only(path: Path, pattern: str) -> Path:
    (found,) = path.glob(pattern)
    return found


def test_only_a_regular_file_is_opened_or_read(tmp_path):
    regular = tmp_path / "x.npy"
    np.save(regular, np.arange(3.0))
    assert check_regular(regular, NPY) == regular.stat().st_size
    assert (load_npy(regular, NPY, mmap=True) == np.arange(3.0)).all()
    fd, size = open_fd(regular, NPY)
    os.close(fd)
    with open_binary(regular, NPY) as f:
        assert size == regular.stat().st_size and f.read(6) == b"\x93NUMPY" and os.get_blocking(f.fileno())
    fifo, device = tmp_path / "fifo.npy", tmp_path / "zero.npy"
    os.mkfifo(fifo)
    device.symlink_to("/dev/zero")
    (tmp_path / "folder.npy").mkdir()
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "socket.npy"))
    cases = {fifo: "a FIFO", device: "a character device", tmp_path / "folder.npy": "a directory",
             tmp_path / "socket.npy": "a socket"}
    for path, kind in cases.items():
        for read in (check_regular, open_fd, open_binary, read_text, load_npy):
            with pytest.raises(NotRegularFileError) as error:
                finishes(lambda: read(path, NPY), [fifo], seconds=10)
            assert str(error.value) == f"{path}: not a regular file ({kind}); expected a .npy tensor file"
            assert error.value.strerror == f"not a regular file ({kind}); expected a .npy tensor file"
    listening.close()


@pytest.mark.parametrize("replaced", ["fifo", "device"])
def test_a_tensor_file_in_place_of_a_packed_file_is_named(dump, replaced):
    packs = sorted(dump.glob("tensors/key_data/rank=0/*.npys"))  # both steps' records: one file, or two
    for pack in packs:
        (fifo_in_place_of if replaced == "fifo" else zero_device_in_place_of)(pack)
    kind = "a FIFO" if replaced == "fifo" else "a character device"
    opened = rlprobe.open(dump)
    for step in (0, 1):
        with pytest.raises(DumpReadError) as error:
            finishes(lambda: opened.tensor("log_prob", step), packs)
        pack = dump / next(r["tensor_file"] for r in opened.arrow("key_data").to_pylist() if r["step"] == step)
        assert str(error.value) == (f"{pack}: cannot read tensor (not a regular file ({kind}); "
                                    "expected a packed .npys tensor file)")


def test_a_fifo_stats_part_is_named_by_every_reader(dump):
    part = fifo_in_place_of(_only(dump, "stats/key_data/rank=0/part-*.parquet"))
    message = (f"{part}: unreadable Parquet part (not a regular file (a FIFO); expected a Parquet stats part); "
               "its rows are missing from this dump")
    opened = rlprobe.open(dump)
    for read in (lambda: opened.arrow("key_data"), lambda: opened.key_data().collect(), opened.connect):
        with pytest.raises(DumpReadError) as error:
            finishes(read, [part])
        assert str(error.value) == message
    errors: list[str] = []
    assert finishes(lambda: opened.arrow("key_data", errors=errors), [part]).num_rows == 0 and errors == [message]
    info = finishes(lambda: json.loads(CliRunner().invoke(main, ["info", str(dump), "--json"]).output), [part])
    assert info["problems"] == [message] and info["scalars"]  # the scalars are read
    code, output = finishes(lambda: _cli("sql", dump, "SELECT count(*) FROM key_data"), [part])
    assert code == 3 and output == f"error: {' '.join(message.split())}"
    code, output = finishes(lambda: _cli("compact", dump), [part])
    assert code == 3 and output == f"error: {' '.join(message.split())}; nothing was compacted"
    assert part.is_fifo()


@pytest.mark.parametrize("name", ["rlprobe.json", "rank0.json", "configurations.json"])
def test_a_fifo_manifest_or_config_is_named(dump, name):
    fifo = fifo_in_place_of(dump / name)
    message = f"{fifo}: unreadable JSON (not a regular file (a FIFO); expected a JSON file)"
    opened = rlprobe.open(dump)
    read = {"rlprobe.json": lambda: opened.manifest, "rank0.json": lambda: opened.rank_manifests,
            "configurations.json": opened.configs}[name]
    with pytest.raises(DumpReadError) as error:
        finishes(read, [fifo])
    assert str(error.value) == message
    code, output = finishes(lambda: _cli("info", dump), [fifo])
    if name == "configurations.json":  # a problem of the dump, whose other files are shown
        assert code == 0 and f"!{message}; left out of configs".replace(" ", "") in output.replace(" ", "")
    else:
        assert code == 3 and output == f"error: {message}"


def test_a_fifo_lock_file_is_refused_and_compact_changes_nothing(dump):
    lock = fifo_in_place_of(dump / ".rank0.lock")  # the file a closed probe leaves (lake/rank_lock.py)
    before = sorted(p.name for p in (dump / "stats" / "key_data" / "rank=0").iterdir())
    with pytest.raises(ProbeError) as error:
        finishes(lambda: rlprobe.Probe(dump, mode="append"), [lock])
    assert str(error.value) == (f"cannot open the lock file {lock} of rank 0: not a regular file (a FIFO); "
                                "expected a rank's lock file")
    code, output = finishes(lambda: _cli("compact", dump), [lock])
    assert code == 3 and output == f"error: {' '.join(str(error.value).split())}", output
    assert sorted(p.name for p in (dump / "stats" / "key_data" / "rank=0").iterdir()) == before


def _msprobe_run(path: Path) -> Path:
    for step in range(2):
        folder = path / "data" / "log_prob" / f"step{step}" / "rank0" / "micro_step0"
        folder.mkdir(parents=True)
        np.save(folder / "log_prob.npy", np.arange(4, dtype=np.float32) + step)
        (folder / "log_prob.json").write_text(json.dumps({"data": {"max": 3.0 + step, "min": float(step),
                                                                   "shape": [4]}}))
    (path / "configurations.json").write_text('{"lr": 0.1}')
    return path


@pytest.mark.parametrize("name", ["log_prob.npy", "configurations.json"])
def test_import_msprobe_names_a_fifo(tmp_path, name):
    run = _msprobe_run(tmp_path / "run")
    fifo = fifo_in_place_of(run / name if name == "configurations.json"
                            else run / "data" / "log_prob" / "step1" / "rank0" / "micro_step0" / name)
    code, output = finishes(lambda: _cli("import-msprobe", run, tmp_path / "out"), [fifo])
    reason = "not a regular file (a FIFO); expected " + ("a JSON file" if name.endswith("json") else "a .npy tensor file")
    what = "unreadable JSON" if name.endswith("json") else "cannot read tensor"
    assert code == 3 and output == f"error: {fifo}: {what} ({reason})", output


def test_a_fifo_grad_summary_of_an_msprobe_grad_dump_is_named(fixtures_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(fixtures_dir / "msprobe" / "grad" / "run_a", run)
    fifo = fifo_in_place_of(run / "rank0" / "grad_summary_3.csv")
    with pytest.raises(DumpReadError) as error:
        finishes(lambda: rlprobe.open(run).arrow("grad"), [fifo])
    assert str(error.value) == f"{fifo}: not a regular file (a FIFO); expected msprobe's grad_summary .csv file"
