"""MindSpore tensors (CPU, pynative) through Probe.save: dtypes, stats, lossless tensors, hashes."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
import torch

import rlprobe
from rlprobe.lake.tensor_pack import record_layout, record_of

# values exactly representable in bfloat16 and float16, plus ones that are not (rounded on cast)
F32 = np.array([[0.0, 1.5, -2.25, 3.0078125], [1e-3, -7.0, 65504.0, 0.1]], dtype=np.float32)
TOKENS = np.array([[3, 17, 151643, 0], [42, 7, 9, 151645]], dtype=np.int64)  # needs 32 bits on disk
SMALL_INTS = np.array([1, 2, 250, 0], dtype=np.int64)  # fits uint8 on disk
BIG_INTS = np.array([2**40 + 1, -(2**62) - 3, 5], dtype=np.int64)  # beyond float64 precision
MASK = np.array([[True, False, True], [False, False, True]])


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns as torch rounds them (independent of the MindSpore cast)."""
    return torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _blake(raw: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(raw).tobytes(), digest_size=16).hexdigest()


def _expected_stats(values: np.ndarray) -> dict[str, float | int]:
    v = values.astype(np.float64).reshape(-1)
    return {
        "min": float(v.min()), "max": float(v.max()), "mean": float(v.mean()),
        "norm": float(np.sqrt(np.sum(v * v))),
        "nan_count": int(np.isnan(v).sum()), "inf_count": int(np.isinf(v).sum()),
        "zero_count": int(np.sum(v == 0)),
    }


def _check_stats(row: dict, values: np.ndarray) -> None:
    where = (row["key"], row["index"])
    exp = _expected_stats(values)
    assert row["min"] == exp["min"], where
    assert row["max"] == exp["max"], where
    assert row["mean"] == pytest.approx(exp["mean"], rel=1e-12, abs=1e-300), where
    assert row["norm"] == pytest.approx(exp["norm"], rel=1e-12, abs=1e-300), where
    for k in ("nan_count", "inf_count", "zero_count"):
        assert row[k] == exp[k], (where, k)
    assert row["numel"] == values.size, where
    assert row["shape"] == list(values.shape), where


def _rows(dump) -> dict[tuple[str, int, int, str], dict]:
    df = dump.key_data().collect()
    return {(r["key"], r["step"], r["micro_step"], r["index"]): r for r in df.iter_rows(named=True)}


@pytest.fixture(scope="module")
def ms_dump(tmp_path_factory) -> Path:
    """One probe run saving every MindSpore dtype, nested values and mixed frameworks."""
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    path = tmp_path_factory.mktemp("ms") / "dump"
    probe = rlprobe.Probe(path, framework="mindspore")
    probe.save({
        "f32": ms.Tensor(F32),
        "f16": ms.Tensor(F32.astype(np.float16)),
        "bf16": ms.Tensor(F32, ms.bfloat16),
        "f64": ms.Tensor(F32.astype(np.float64) / 3),
        "tokens": ms.Tensor(TOKENS),
        "small_ints": ms.Tensor(SMALL_INTS),
        "big_ints": ms.Tensor(BIG_INTS),
        "int32": ms.Tensor(np.array([-5, 0, 70000], np.int32)),
        "mask": ms.Tensor(MASK),
        "scalar": ms.Tensor(np.float32(2.5)),
        "scalar_int": ms.Tensor(np.int64(-7)),
        "scalar_bf16": ms.Tensor(np.float32(-0.375), ms.bfloat16),
    })
    probe.save({  # lists and dicts of MindSpore tensors, nested
        "list": [ms.Tensor(F32[0]), ms.Tensor(TOKENS[1])],
        "dict": {"logits": ms.Tensor(F32[1], ms.bfloat16), "inner": {"ids": [ms.Tensor(SMALL_INTS)]}},
    })
    probe.save({"f32": ms.Tensor(F32 * 2)})  # micro step 1
    probe.log_metrics({"loss": ms.Tensor(np.float32(0.25)), "tps": 10.0})
    probe.save_config({"lr": 1e-5, "seed": 7})
    probe.step()
    in_place = ms.Tensor(np.arange(4, dtype=np.float32))
    probe.save({"snap": in_place})
    in_place[0] = 99.0  # changed after save: the dump keeps what was saved
    probe.save({"special": ms.Tensor(np.array([np.nan, np.inf, -np.inf, 0.0, 1.0], np.float16))})
    probe.close()
    return path


@pytest.fixture(scope="module")
def ms_rows(ms_dump: Path):
    return _rows(rlprobe.open(ms_dump))


PLAIN = {
    "f32": (F32, "float32"),
    "f64": (F32.astype(np.float64) / 3, "float64"),
    "tokens": (TOKENS, "int64"),
    "small_ints": (SMALL_INTS, "int64"),
    "big_ints": (BIG_INTS, "int64"),
    "int32": (np.array([-5, 0, 70000], np.int32), "int32"),
    "mask": (MASK, "bool"),
    "scalar": (np.array(2.5, np.float32), "float32"),
    "scalar_int": (np.array(-7, np.int64), "int64"),
}


@pytest.mark.parametrize("key", sorted(PLAIN))
def test_plain_dtypes_stats_and_lossless(ms_dump, ms_rows, key):
    expected, dtype = PLAIN[key]
    row = ms_rows[(key, 0, 0, "")]
    assert row["dtype"] == dtype
    assert row["framework"] == "mindspore"
    assert row["rank"] == 0
    stats_values = expected.astype(np.uint8) if expected.dtype == np.bool_ else expected
    _check_stats(row, stats_values)
    assert row["hash"] == _blake(expected)
    got = rlprobe.open(ms_dump).tensor(key, 0)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def test_float16_widened_exactly(ms_dump, ms_rows):
    half = F32.astype(np.float16)
    row = ms_rows[("f16", 0, 0, "")]
    assert row["dtype"] == "float16" and row["framework"] == "mindspore"
    _check_stats(row, half.astype(np.float32))
    assert row["hash"] == _blake(half)  # the float16 bytes, not the widened ones
    got = rlprobe.open(ms_dump).tensor("f16", 0)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, F32.astype(np.float16).astype(np.float32))


def test_integers_stored_narrow_but_read_back_original(ms_dump, ms_rows):
    rows = {k: ms_rows[(k, 0, 0, "")] for k in ("tokens", "small_ints", "big_ints", "mask")}
    on_disk = {k: record_layout(str(ms_dump / r["tensor_file"]), record_of(r["tensor_offset"], r["tensor_length"])).dtype
               for k, r in rows.items()}  # the stored dtype: its record's header in the save call's packed file
    assert {k: (d.kind, d.itemsize) for k, d in on_disk.items() if k != "mask"} == {
        "tokens": ("u", 4), "small_ints": ("u", 1), "big_ints": ("i", 8)}  # narrowest that holds the values
    assert on_disk["mask"] == np.bool_
    # big integers beyond 2**53 keep every bit
    got = rlprobe.open(ms_dump).tensor("big_ints", 0)
    assert got.tolist() == BIG_INTS.tolist()


@pytest.mark.parametrize("key,values", [("bf16", F32), ("scalar_bf16", np.array(-0.375, np.float32))])
def test_bfloat16_widened_exactly_and_hashed_as_bf16_bytes(ms_dump, ms_rows, key, values):
    bits = _bf16_bits(values)
    widened = (bits.astype(np.uint32) << 16).view(np.float32)
    row = ms_rows[(key, 0, 0, "")]
    assert row["dtype"] == "bfloat16"
    assert row["framework"] == "mindspore"
    assert row["hash"] == _blake(bits)  # blake2b-128 of the uint16 bit patterns
    assert row["hash"] != _blake(widened)
    _check_stats(row, widened)
    got = rlprobe.open(ms_dump).tensor(key, 0)
    assert got.dtype == np.float32
    assert got.shape == values.shape
    np.testing.assert_array_equal(got.view(np.uint32), widened.view(np.uint32))  # bit-exact
    assert np.load(ms_dump / row["tensor_file"]).dtype == np.float32


def test_bfloat16_rounding_happened(ms_dump):
    """Values not representable in bf16 come back as their bf16 rounding, not the float32 input."""
    got = rlprobe.open(ms_dump).tensor("bf16", 0)
    assert got[0, 3] == 3.0 and F32[0, 3] != 3.0


def test_nested_lists_and_dicts(ms_dump, ms_rows):
    dump = rlprobe.open(ms_dump)
    items = {
        ("list", "0"): (F32[0], "float32"),
        ("list", "1"): (TOKENS[1], "int64"),
        ("dict", "inner.ids.0"): (SMALL_INTS, "int64"),
    }
    for (key, index), (values, dtype) in items.items():
        row = ms_rows[(key, 0, 0, index)]
        assert row["dtype"] == dtype and row["framework"] == "mindspore", (key, index)
        _check_stats(row, values)
        got = dump.tensor(key, 0, index=index)
        assert got.dtype == values.dtype
        np.testing.assert_array_equal(got, values)
    row = ms_rows[("dict", 0, 0, "logits")]
    bits = _bf16_bits(F32[1])
    assert row["dtype"] == "bfloat16" and row["hash"] == _blake(bits)
    np.testing.assert_array_equal(dump.tensor("dict", 0, index="logits"),
                                  (bits.astype(np.uint32) << 16).view(np.float32))
    # exactly these indices, nothing else
    assert {k[3] for k in ms_rows if k[0] in ("list", "dict")} == {"0", "1", "logits", "inner.ids.0"}


def test_micro_steps_and_steps(ms_dump, ms_rows):
    dump = rlprobe.open(ms_dump)
    np.testing.assert_array_equal(dump.tensor("f32", 0, micro_step=1), F32 * 2)
    assert ms_rows[("list", 0, 0, "0")]["micro_step"] == 0  # its own key's first save in the step
    np.testing.assert_array_equal(dump.tensor("snap", 1), np.arange(4, dtype=np.float32))  # snapshot at save
    assert dump.complete is True
    assert dump.configs() == {0: {"lr": 1e-5, "seed": 7}}
    scalars = dump.scalars().collect().sort("name")
    assert scalars["name"].to_list() == ["loss", "tps"]
    assert scalars["value"].to_list() == [0.25, 10.0]


def test_nan_and_inf_counts(ms_rows):
    row = ms_rows[("special", 1, 0, "")]
    assert row["dtype"] == "float16"
    assert (row["nan_count"], row["inf_count"], row["zero_count"], row["numel"]) == (1, 2, 1, 5)
    raw = np.array([np.nan, np.inf, -np.inf, 0.0, 1.0], np.float16)
    assert row["hash"] == _blake(raw)


def test_mixed_frameworks_in_one_save(tmp_path):
    bf_values = np.array([[1.5, -0.1, 3.0078125]], np.float32)
    probe = rlprobe.Probe(tmp_path / "mixed")  # framework detected per value
    probe.save({
        "ms": ms.Tensor(F32),
        "pt": torch.from_numpy(F32.copy()),
        "np": F32.copy(),
        "ms_bf16": ms.Tensor(bf_values, ms.bfloat16),
        "pt_bf16": torch.from_numpy(bf_values).to(torch.bfloat16),
        "ms_tokens": ms.Tensor(TOKENS),
        "pt_tokens": torch.from_numpy(TOKENS.copy()),
        "mixed_list": [ms.Tensor(SMALL_INTS), torch.tensor([1.0, 2.0]), np.float64(3.5), 4, True],
        "mixed_dict": {"m": ms.Tensor(np.array(True)), "t": torch.tensor(False)},
    })
    probe.step()
    probe.close()
    dump = rlprobe.open(tmp_path / "mixed")
    rows = _rows(dump)
    fw = {(k, i): r["framework"] for (k, _, _, i), r in rows.items()}
    assert fw == {
        ("ms", ""): "mindspore", ("pt", ""): "torch", ("np", ""): "numpy",
        ("ms_bf16", ""): "mindspore", ("pt_bf16", ""): "torch",
        ("ms_tokens", ""): "mindspore", ("pt_tokens", ""): "torch",
        ("mixed_list", "0"): "mindspore", ("mixed_list", "1"): "torch", ("mixed_list", "2"): "numpy",
        ("mixed_list", "3"): "numpy", ("mixed_list", "4"): "numpy",
        ("mixed_dict", "m"): "mindspore", ("mixed_dict", "t"): "torch",
    }
    # the same values give the same dtype, stats and hash whatever framework held them
    cols = ("dtype", "shape", "numel", "min", "max", "mean", "norm", "zero_count", "hash")
    for a, b in (("ms", "pt"), ("ms", "np"), ("ms_bf16", "pt_bf16"), ("ms_tokens", "pt_tokens")):
        ra, rb = rows[(a, 0, 0, "")], rows[(b, 0, 0, "")]
        assert {c: ra[c] for c in cols} == {c: rb[c] for c in cols}, (a, b)
        np.testing.assert_array_equal(dump.tensor(a, 0), dump.tensor(b, 0))
        assert dump.tensor(a, 0).dtype == dump.tensor(b, 0).dtype
    assert rows[("ms_bf16", 0, 0, "")]["hash"] == _blake(_bf16_bits(bf_values))
    assert dump.tensor("mixed_list", 0, index="0").dtype == np.int64
    assert dump.tensor("mixed_dict", 0, index="m").dtype == np.bool_
    assert bool(dump.tensor("mixed_dict", 0, index="m")) is True
    assert bool(dump.tensor("mixed_dict", 0, index="t")) is False
    assert dump.tensor("mixed_list", 0, index="2").dtype == np.float64


def test_stats_only_mindspore(tmp_path):
    probe = rlprobe.Probe(tmp_path / "so", framework="mindspore", stats_only=True)
    probe.save({"bf16": ms.Tensor(F32, ms.bfloat16), "tokens": ms.Tensor(TOKENS)})
    probe.close()
    dump = rlprobe.open(tmp_path / "so")
    rows = _rows(dump)
    bits = _bf16_bits(F32)
    assert rows[("bf16", 0, 0, "")]["hash"] == _blake(bits)
    _check_stats(rows[("bf16", 0, 0, "")], (bits.astype(np.uint32) << 16).view(np.float32))
    _check_stats(rows[("tokens", 0, 0, "")], TOKENS)
    assert all(r["tensor_file"] is None for r in rows.values())
    assert not (tmp_path / "so" / "tensors").exists() or not any((tmp_path / "so" / "tensors").rglob("*.npy"))
    with pytest.raises(rlprobe.DumpReadError, match="statistics only"):
        dump.tensor("tokens", 0)


def test_unsupported_mindspore_dtype_raises_naming_key(tmp_path):
    complex_dtype = getattr(ms, "complex64", None)
    if complex_dtype is None:
        pytest.skip("this MindSpore has no complex64")
    value = ms.Tensor(np.array([1 + 2j], np.complex64))
    probe = rlprobe.Probe(tmp_path / "bad", framework="mindspore")
    with pytest.raises(rlprobe.ProbeError, match="'z'.*[Cc]omplex"):
        probe.save({"z": value})
    probe.save({"ok": ms.Tensor(F32)})  # the probe stays usable
    probe.close()
    assert set(rlprobe.open(tmp_path / "bad").key_data().collect()["key"]) == {"ok"}


def test_sql_sees_mindspore_rows(ms_dump):
    con = rlprobe.open(ms_dump).connect()
    rows = con.sql("select key, dtype from key_data where framework = 'mindspore' and key in ('bf16', 'mask') "
                   "order by key").fetchall()
    assert rows == [("bf16", "bfloat16"), ("mask", "bool")]
    assert math.isclose(con.sql("select value from scalars where name = 'loss'").fetchall()[0][0], 0.25)


def test_replay_returns_the_baseline_as_mindspore_tensors_bit_for_bit(tmp_path):
    """probe.replay() with MindSpore live values: the baseline's tensors as MindSpore tensors of the
    baseline's dtype (bfloat16 included, widened on disk and cast back exactly), docs/replay.md."""
    saved = {"responses": ms.Tensor(TOKENS), "mask": ms.Tensor(MASK),
             "rewards": ms.Tensor(F32).astype(ms.bfloat16), "values": ms.Tensor(F32).astype(ms.float16),
             "log_prob": ms.Tensor(F32)}
    with rlprobe.Probe(tmp_path / "a") as probe:
        probe.save(saved)
    live = {"responses": ms.Tensor(np.zeros((1, 2), np.int32)), "mask": ms.Tensor(np.ones((1, 1), bool)),
            "rewards": ms.Tensor(np.zeros((1, 1), np.float32)), "values": ms.Tensor(np.zeros((1, 1), np.float32)),
            "log_prob": ms.Tensor(np.zeros((1, 1), np.float32))}
    with rlprobe.Probe(tmp_path / "b", replay_from=tmp_path / "a") as probe:
        got = probe.replay(live)
    for key, want in saved.items():
        assert isinstance(got[key], ms.Tensor) and got[key].dtype == want.dtype, key
        if want.dtype == ms.bfloat16:  # numpy has no bfloat16: compare the bits through float32
            assert np.array_equal(got[key].astype(ms.float32).asnumpy().view(np.uint32),
                                  want.astype(ms.float32).asnumpy().view(np.uint32)), key
        else:
            assert got[key].asnumpy().tobytes() == want.asnumpy().tobytes(), key


def test_replay_of_a_dtype_mindspore_cannot_hold_names_it(tmp_path):
    with rlprobe.Probe(tmp_path / "a") as probe:
        probe.save({"scores": torch.tensor([0.5, -1.0]).to(torch.float8_e4m3fn)})
    with rlprobe.Probe(tmp_path / "b", replay_from=tmp_path / "a") as probe:
        with pytest.raises(rlprobe.ProbeError, match=r"key 'scores' step 0 .*no float8_e4m3fn tensor"):
            probe.replay({"scores": ms.Tensor(np.zeros(2, np.float32))})
