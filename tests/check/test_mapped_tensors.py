"""Tensor files mapped for the token kernel read as Dump.load_tensor reads them, and a damaged file
is named in the error."""

from __future__ import annotations

import numpy as np
import pytest

import rlprobe
from rlprobe.checks.inputs import stats_table
from rlprobe.checks.token_rows import READ_BELOW, map_tensor
from rlprobe.checks.token_tables import tensor_rows
from rlprobe.errors import DumpReadError
from rlprobe.lake.npy_header import plain_header
from rlprobe.lake.reader import open_dump


def saved(tmp_path, tensors):
    with rlprobe.Probe(tmp_path / "d", flush_interval=0) as p:
        p.save(tensors)
        p.step()
    dump = open_dump(tmp_path / "d")
    return dump, tensor_rows(stats_table(dump))


def test_mapped_tensors_equal_numpy_reads(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"old_log_prob": -rng.random((3, 5), dtype=np.float32), "log_prob": -rng.random((2, 4)),
               "response_mask": rng.random((3, 5)) > 0.5, "advantages": np.asfortranarray(rng.random((4, 3)))}
    dump, rows = saved(tmp_path, tensors)
    assert {k[0] for k in rows} == set(tensors)
    for row in rows.values():
        mapped = map_tensor(dump, row)
        expected = dump.load_row_tensor(row)
        assert mapped.dtype == expected.dtype and mapped.shape == expected.shape
        assert (mapped == expected).all()
        assert not mapped.flags.writeable


def test_truncated_and_damaged_tensor_files_are_named(tmp_path):
    dump, rows = saved(tmp_path, {"old_log_prob": np.ones((64, 64), np.float32)})
    row = next(iter(rows.values()))
    path = dump.path / row["tensor_file"]
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DumpReadError, match=str(path.name)):
        map_tensor(dump, row)
    path.write_bytes(b"not a numpy file")
    with pytest.raises(DumpReadError, match="cannot read tensor"):
        map_tensor(dump, row)
    path.unlink()
    with pytest.raises(DumpReadError, match="cannot read tensor"):
        map_tensor(dump, row)


@pytest.mark.parametrize("array", [np.zeros((64, 4096), np.float32), np.ones(5, np.bool_), np.float64(3.5),
                                   np.zeros((2, 0, 3), np.uint16), np.arange(12, dtype=">f8").reshape(3, 4)],
                         ids=["f32", "bool", "scalar", "empty", "big-endian"])
def test_plain_header_reads_what_numpy_reads(array, tmp_path):
    np.save(tmp_path / "x.npy", array)
    raw = (tmp_path / "x.npy").read_bytes()
    with open(tmp_path / "x.npy", "rb") as f:
        np.lib.format.read_magic(f)
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        offset = f.tell()
    assert plain_header(raw[:256]) == (shape, dtype, offset) and not fortran


def test_headers_numpy_writes_otherwise_go_to_numpy(tmp_path):
    for name, array in (("fortran", np.asfortranarray(np.zeros((3, 4)))),
                        ("structured", np.zeros(3, np.dtype([("a", "<f4")])))):
        np.save(tmp_path / f"{name}.npy", array)
        assert plain_header((tmp_path / f"{name}.npy").read_bytes()[:256]) is None, name
    assert plain_header(b"not a numpy file") is None


def test_large_files_are_mapped_and_small_ones_read_alike(tmp_path):
    rng = np.random.default_rng(2)
    large = -rng.random((64, 2 * READ_BELOW // 256), dtype=np.float32)  # twice the size read whole
    dump, rows = saved(tmp_path, {"old_log_prob": large, "log_prob": large[:2, :8].copy()})
    sizes = {}
    for row in rows.values():
        mapped = map_tensor(dump, row)
        sizes[row["canonical"]] = row["tensor_length"]  # its record in the save call's packed file
        assert (mapped == dump.load_row_tensor(row)).all()
        assert not mapped.flags.writeable
    assert sizes["old_log_prob"] > READ_BELOW >= sizes["log_prob"]


def test_a_row_range_maps_those_rows_only_and_equals_the_slice(tmp_path):
    rng = np.random.default_rng(3)
    tensors = {"old_log_prob": rng.random((300, 1000), dtype=np.float32), "response_mask": rng.random((300, 999)) > 0.5}
    dump, rows = saved(tmp_path, tensors)
    for row in rows.values():
        full = dump.load_row_tensor(row)
        for picks in (slice(0, 300), slice(1, 2), slice(17, 123), slice(299, 300), slice(5, 5), slice(0, 300, 2)):
            got = map_tensor(dump, row, picks)
            assert got.shape == full[picks].shape and (got == full[picks]).all(), (row["canonical"], picks)


@pytest.mark.timeout(300)  # finishes() fails a check that waits on a FIFO long before this
@pytest.mark.parametrize("replaced", ["fifo", "device"])
def test_rlprobe_check_names_a_tensor_file_that_is_not_a_regular_file(tmp_path, replaced):
    """A FIFO in place of a packed file made the check wait for a writer forever (lake/regular_files.py): it is
    exit 3 naming the file, as a truncated one is: its steps make enough pairs for the compiled reads
    (token_batch.py: kernels.reduce_batch opens files with O_NONBLOCK), and map_tensor (numpy's) names it."""
    from click.testing import CliRunner

    from rlprobe.cli import main
    from tests.lake.fifos import fifo_in_place_of, finishes, zero_device_in_place_of

    rng = np.random.default_rng(5)
    with rlprobe.Probe(tmp_path / "d", flush_interval=0) as p:
        for _ in range(12):
            old = -rng.random((4, 33), dtype=np.float32) * 3
            p.save({"rollout_log_prob": old + 0.01, "old_log_prob": old, "response_mask": rng.random(old.shape) > 0.25})
            p.step()
    packs = sorted((tmp_path / "d" / "tensors" / "key_data" / "rank=0").glob("*.npys"))  # one, or a few
    for pack in packs:
        (fifo_in_place_of if replaced == "fifo" else zero_device_in_place_of)(pack)
    kind = "a FIFO" if replaced == "fifo" else "a character device"
    messages = {f"{pack}: cannot read tensor (not a regular file ({kind}); expected a packed .npys tensor file)"
                for pack in packs}
    dump, rows = open_dump(tmp_path / "d"), tensor_rows(stats_table(open_dump(tmp_path / "d")))
    with pytest.raises(DumpReadError) as error:
        finishes(lambda: map_tensor(dump, next(iter(rows.values()))), packs)
    assert str(error.value) in messages
    result = finishes(lambda: CliRunner().invoke(main, ["check", str(tmp_path / "d"), "-o", str(tmp_path / "out")]),
                      packs)
    output = " ".join(result.output.split())
    assert result.exit_code == 3 and output in {f"error: cannot check {dump.path}: {m}" for m in messages}, output
