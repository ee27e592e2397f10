"""One .npy file of a pair (rlprobe/comparison/npy_files.py): a header numpy wrote the plain way is
opened without np.load, anything else through np.load, and both read the values np.load reads; a
file that is not what its header says is named as before."""

from __future__ import annotations

import os

import numpy as np
import pytest

from rlprobe.comparison.npy_files import PairError, NpyFile

PLAIN = {
    "f4_2d": np.arange(12, dtype=np.float32).reshape(3, 4),
    "f8_scalar": np.float64(3.5),
    "bool": np.array([True, False, True]),
    "i2": np.arange(-3, 4, dtype=np.int16),
    "u1": np.arange(3, dtype=np.uint8),
    "f2": np.linspace(-1, 1, 5).astype(np.float16),
    "i8_3d": np.arange(24, dtype=np.int64).reshape(2, 3, 4),
}
OTHER = {  # opened through np.load
    "big_endian": np.arange(10, dtype=">f4"),
    "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    "complex": np.ones(2, np.complex64),
    "empty": np.zeros((0, 3), np.float32),
}


def _plain(f: NpyFile, io: str) -> bool:
    if io == "pread":
        return f._fd is not None
    return f._arr is not None and not isinstance(f._arr, np.memmap) and not isinstance(f._arr.base, np.memmap)


@pytest.mark.parametrize("io", ["mmap", "pread"])
@pytest.mark.parametrize("name", list(PLAIN) + list(OTHER))
def test_a_file_reads_what_np_load_reads(tmp_path, name, io):
    value = {**PLAIN, **OTHER}[name]
    path = str(tmp_path / f"{name}.npy")
    np.save(path, value)
    want = np.load(path)
    f = NpyFile(path, 0, io)
    try:
        assert (f.shape, f.dtype, f.size) == (want.shape, want.dtype, want.size)
        if name in PLAIN:
            assert _plain(f, io)
        if io == "mmap" and name in OTHER:
            assert not _plain(f, io)
        got = f.read(0, f.size).copy() if f.size else np.empty(0, want.dtype)
        np.testing.assert_array_equal(got, want.reshape(-1))
        if f.size > 2:
            np.testing.assert_array_equal(f.read(1, f.size - 1), want.reshape(-1)[1:-1])
    finally:
        f.close()


def test_a_version_2_header_is_opened_the_plain_way(tmp_path):
    path = str(tmp_path / "v2.npy")
    with open(path, "wb") as fh:
        np.lib.format.write_array(fh, np.arange(4, dtype=np.float32), version=(2, 0))
    f = NpyFile(path, 0, "mmap")
    assert _plain(f, "mmap") and f.read(0, 4).tolist() == [0.0, 1.0, 2.0, 3.0]
    f.close()


def test_a_header_whose_length_field_lies_goes_to_np_load_which_names_the_file(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(8, dtype=np.float32))
    raw = bytearray(path.read_bytes())
    raw[8] += 16  # the header claims 16 more bytes than its text
    path.write_bytes(bytes(raw))
    with pytest.raises(PairError, match=str(path).replace("\\", "\\\\")):
        NpyFile(str(path), 0, "mmap")


@pytest.mark.parametrize("io", ["mmap", "pread"])
def test_a_truncated_file_is_named_as_truncated(tmp_path, io):
    path = tmp_path / "t.npy"
    np.save(path, np.arange(1000, dtype=np.float64))
    os.truncate(path, path.stat().st_size - 8)
    with pytest.raises(PairError, match="truncated .npy file"):
        NpyFile(str(path), 0, io)
