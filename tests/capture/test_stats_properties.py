"""Property tests: the stats row, the hash and the raw tensor of every saved value.

Every tensor saved through `Probe.save` must come back with
- statistics equal to numpy's on the exact float64 widening of its values (NaN propagates
  into min/max/mean/norm as in numpy; counts and min/max exact; mean/norm within 1e-9),
- hash == blake2b-128 of its raw bytes in the original dtype, C order,
- a tensor from `Dump.tensor()` that is bit-for-bit the original (integers in their own
  dtype, bool as bool, bf16/fp16 widened exactly to float32).
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlprobe

TORCH_DTYPES = {
    "bool": torch.bool,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
NUMPY_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")
INT_NAMES = ("int8", "int16", "int32", "int64", "uint8")
FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")
SPECIALS = [math.nan, math.inf, -math.inf, -0.0, 0.0]


# -- expected values ---------------------------------------------------------------------
@dataclass
class Expected:
    """What the dump must say about one saved value, computed independently of rlprobe."""

    dtype: str
    shape: tuple[int, ...]
    raw: np.ndarray  # C-order bytes in the original dtype (bf16 as uint16 bit patterns)
    values: np.ndarray  # the exact values: float32 for bf16/fp16, else the original numpy dtype


def expected_from_torch(t: torch.Tensor) -> Expected:
    name = str(t.dtype).removeprefix("torch.")
    c = t.contiguous()
    if t.dtype == torch.bfloat16:
        raw = c.view(torch.int16).numpy().view(np.uint16).copy()
        values = c.float().numpy().copy()
    else:
        raw = c.numpy().copy()
        values = raw.astype(np.float32) if t.dtype == torch.float16 else raw
    return Expected(name, tuple(t.shape), raw, values)


def expected_from_numpy(a: np.ndarray) -> Expected:
    name = "bool" if a.dtype == np.bool_ else a.dtype.name
    raw = np.array(a, copy=True, order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    values = raw.astype(np.float32) if raw.dtype == np.float16 else raw
    return Expected(name, tuple(a.shape), raw, values)


def reference_stats(exp: Expected) -> dict[str, float | int | None]:
    """numpy on the float64 widening: the contract's definition of each statistic."""
    v = exp.values
    if v.dtype == np.bool_:
        v = v.astype(np.uint8)
    w = v.astype(np.float64).reshape(-1)  # exact for every dtype except |int64| > 2**53
    is_float = v.dtype.kind == "f"
    out: dict[str, float | int | None] = {
        "nan_count": int(np.isnan(w).sum()) if is_float else 0,
        "inf_count": int(np.isinf(w).sum()) if is_float else 0,
        "zero_count": int((w == 0).sum()) if is_float else int((v.reshape(-1) == 0).sum()),
        "numel": int(v.size),
    }
    if v.size == 0:
        out.update(min=None, max=None, mean=None, norm=0.0)
        return out
    with np.errstate(invalid="ignore", over="ignore"):
        if is_float:
            out["min"] = float(np.min(w))
            out["max"] = float(np.max(w))
        else:  # exact integer extremes, rounded once to float64
            out["min"] = float(int(v.min()))
            out["max"] = float(int(v.max()))
        out["mean"] = float(np.sum(w) / w.size)
        out["norm"] = float(np.sqrt(np.sum(w * w)))
        # scale for summation-order tolerance (catastrophic cancellation in the mean)
        out["_abs_mean"] = float(np.mean(np.abs(w)))
    return out


def _same_float(got, want, *, rtol: float = 0.0, scale: float = 0.0) -> bool:
    if want is None or got is None:
        return got is None and want is None
    if math.isnan(want):
        return math.isnan(got)
    if math.isinf(want):
        return got == want
    if math.isnan(got) or math.isinf(got):
        return False
    return abs(got - want) <= rtol * max(abs(want), scale)


def check_row(row: dict, exp: Expected, where: str) -> None:
    ref = reference_stats(exp)
    assert row["dtype"] == exp.dtype, where
    assert list(row["shape"]) == list(exp.shape), where
    assert row["numel"] == ref["numel"], where
    for name in ("nan_count", "inf_count", "zero_count"):
        assert row[name] == ref[name], f"{where}: {name} {row[name]} != {ref[name]}"
    for name in ("min", "max"):
        assert _same_float(row[name], ref[name]), f"{where}: {name} {row[name]!r} != {ref[name]!r}"
    assert _same_float(row["mean"], ref["mean"], rtol=1e-9, scale=ref.get("_abs_mean", 0.0)), (
        f"{where}: mean {row['mean']!r} != {ref['mean']!r}")
    assert _same_float(row["norm"], ref["norm"], rtol=1e-9), f"{where}: norm {row['norm']!r} != {ref['norm']!r}"
    want_hash = hashlib.blake2b(exp.raw.tobytes(order="C"), digest_size=16).hexdigest()
    assert row["hash"] == want_hash, f"{where}: hash"


def check_roundtrip(got: np.ndarray, exp: Expected, where: str) -> None:
    want = exp.values
    if exp.dtype in ("bfloat16", "float16"):
        assert got.dtype == np.float32, f"{where}: {got.dtype}"
    else:
        assert got.dtype == want.dtype, f"{where}: read back as {got.dtype}, saved as {want.dtype}"
    assert got.shape == want.shape, where
    if want.dtype.kind == "f":
        assert np.array_equal(got, want, equal_nan=True), where
        assert np.array_equal(np.signbit(got), np.signbit(want)), f"{where}: sign of zeros/NaNs differs"
        finite = ~np.isnan(want)
        bits = {4: np.uint32, 8: np.uint64}[want.dtype.itemsize]
        assert np.array_equal(got[finite].view(bits), want[finite].view(bits)), f"{where}: bits differ"
    else:
        assert np.array_equal(got, want), where


def save_and_check(values: dict[str, object], expected: dict[str, Expected], root: Path) -> None:
    dump_dir = root / "dump"
    with rlprobe.Probe(dump_dir, rank=0, world_size=1) as probe:
        probe.save(values)
        probe.step()
    dump = rlprobe.open(dump_dir)
    rows = {r["key"]: r for r in dump.key_data().collect().to_dicts()}
    assert set(rows) == set(expected)
    for key, exp in expected.items():
        where = f"{key} {exp.dtype} shape {exp.shape}"
        row = rows[key]
        assert (row["step"], row["rank"], row["micro_step"], row["index"]) == (0, 0, 0, "")
        assert row["tensor_file"] is not None
        check_row(row, exp, where)
        check_roundtrip(dump.tensor(key, 0, 0, 0, ""), exp, where)


# -- strategies --------------------------------------------------------------------------
def elements(dtype: str) -> st.SearchStrategy:
    if dtype == "bool":
        return st.booleans()
    if dtype in INT_NAMES:
        info = np.iinfo(dtype)
        return st.one_of(st.sampled_from([0, int(info.min), int(info.max)]),
                         st.integers(int(info.min), int(info.max)))
    if dtype in ("float16", "bfloat16"):
        # any 16-bit pattern (subnormals, NaN payloads, ±0, ±inf) or a special value
        return st.one_of(st.sampled_from(SPECIALS), st.floats(width=16 if dtype == "float16" else 32),
                         st.integers(0, 0xFFFF).map(lambda b: ("bits", b)))
    if dtype == "float32":
        return st.one_of(st.sampled_from(SPECIALS), st.floats(width=32))
    # float64: finite values bounded so that sums of squares cannot overflow by summation order
    return st.one_of(st.sampled_from(SPECIALS),
                     st.floats(min_value=-1e100, max_value=1e100, allow_nan=False),
                     st.floats(min_value=-1e-300, max_value=1e-300))


def _base_numpy(dtype: str, flat: list, shape: tuple[int, ...]) -> np.ndarray:
    """Values as a numpy array (bf16: float32 values, later rounded by torch)."""
    if dtype in ("float16", "bfloat16"):
        np_dtype = np.float16 if dtype == "float16" else np.float32
        out = np.empty(len(flat), dtype=np_dtype)
        for i, x in enumerate(flat):
            if isinstance(x, tuple):  # raw bit pattern
                if dtype == "float16":
                    out[i] = np.array(x[1], np.uint16).view(np.float16)
                else:
                    out[i] = np.array(x[1] << 16, np.uint32).view(np.float32)
            else:
                with np.errstate(over="ignore"):
                    out[i] = x
        return out.reshape(shape)
    np_dtype = np.bool_ if dtype == "bool" else np.dtype(dtype)
    return np.array(flat, dtype=np_dtype).reshape(shape)


VIEWS = ("contiguous", "transposed", "strided", "reversed", "broadcast")


@st.composite
def tensor_cases(draw, dtypes=tuple(TORCH_DTYPES)):
    dtype = draw(st.sampled_from(dtypes))
    view = draw(st.sampled_from(VIEWS))
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    if view == "transposed" and len(shape) < 2:
        shape = shape + (3,) * (2 - len(shape))
    if view in ("strided", "reversed") and len(shape) < 1:
        shape = (4,)
    if view == "strided":  # a strided slice: every other row of a twice-as-long base
        shape = (shape[0] * 2 + 1,) + shape[1:]
    n = math.prod(shape)
    flat = draw(st.lists(elements(dtype), min_size=n, max_size=n))
    return dtype, view, _base_numpy(dtype, flat, shape)


def torch_view(base: np.ndarray, dtype: str, view: str) -> torch.Tensor:
    t = torch.from_numpy(base.copy())
    if dtype == "bfloat16":
        t = t.to(torch.bfloat16)  # rounds float32 values; bit patterns are already exact bf16
    if view == "transposed":
        t = t.transpose(0, -1)
    elif view == "strided":
        t = t[::2]
    elif view == "reversed":
        t = t.flip(0)  # torch has no negative strides; flip + a transposed view for non-contiguity
        if t.dim() >= 2:
            t = t.transpose(0, 1)
    elif view == "broadcast":
        t = t.unsqueeze(0).expand(3, *t.shape)  # stride 0 along the new dim
    return t


def numpy_view(base: np.ndarray, view: str) -> np.ndarray:
    if view == "transposed":
        return base.T
    if view == "strided":
        return base[::2]
    if view == "reversed":
        return base[::-1]
    if view == "broadcast":
        return np.broadcast_to(base, (3, *base.shape))
    return base


# -- tests -------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=tensor_cases())
def test_torch_stats_hash_and_roundtrip(case):
    dtype, view, base = case
    t = torch_view(base, dtype, view)
    assert t.dtype == TORCH_DTYPES[dtype]
    with tempfile.TemporaryDirectory() as tmp:
        save_and_check({"x": t}, {"x": expected_from_torch(t)}, Path(tmp))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=tensor_cases(dtypes=NUMPY_DTYPES))
def test_numpy_stats_hash_and_roundtrip(case):
    dtype, view, base = case
    a = numpy_view(base, view)
    with tempfile.TemporaryDirectory() as tmp:
        save_and_check({"x": a}, {"x": expected_from_numpy(a)}, Path(tmp))


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
def test_specials_every_dtype(tmp_path, dtype):
    """NaN, ±inf and -0.0 (or the dtype's extremes) in every dtype, in one save, plus 0-d and empty."""
    if dtype in FLOAT_NAMES:
        vals = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1.5, -2.25]
        src = torch.tensor(vals, dtype=torch.float64).to(TORCH_DTYPES[dtype])
    elif dtype == "bool":
        src = torch.tensor([True, False, True])
    else:
        info = torch.iinfo(TORCH_DTYPES[dtype])
        src = torch.tensor([info.min, info.max, 0, 1], dtype=TORCH_DTYPES[dtype])
    values = {
        "plain": src,
        "scalar": src[0].clone(),  # 0-d
        "empty": torch.empty((0, 3), dtype=src.dtype),
        "strided": src[::2],
        "transposed": src.repeat(2, 1).t(),
    }
    assert not values["transposed"].is_contiguous()
    save_and_check(values, {k: expected_from_torch(v) for k, v in values.items()}, tmp_path)


def test_large_tensors(tmp_path):
    """~1e6 elements: float32 with NaN/inf/-0.0 sprinkled in, a clean float32, bf16 and int64 ids."""
    rng = np.random.default_rng(0)
    n = 1_000_003
    clean = torch.from_numpy(rng.standard_normal(n).astype(np.float32) * 3 + 0.5)
    dirty = clean.clone()
    dirty[rng.integers(0, n, 50)] = float("nan")
    dirty[rng.integers(0, n, 50)] = float("inf")
    dirty[rng.integers(0, n, 50)] = float("-inf")
    dirty[rng.integers(0, n, 50)] = -0.0
    grid = torch.from_numpy(rng.standard_normal((1000, 1000)).astype(np.float32))
    values = {
        "clean": clean,
        "dirty": dirty,
        "bf16_t": grid.to(torch.bfloat16).t(),  # non-contiguous, 1e6 elements
        "ids": torch.from_numpy(rng.integers(0, 50_000, n)),
        "ids_np": rng.integers(0, 50_000, (1000, 1000)),
    }
    save_and_check(values, {k: (expected_from_numpy(v) if isinstance(v, np.ndarray) else expected_from_torch(v))
                            for k, v in values.items()}, tmp_path)


@pytest.mark.parametrize("source", ["torch", "numpy"])
def test_token_ids_stored_narrow_read_back_int64(tmp_path, source):
    rng = np.random.default_rng(1)
    ids_np = rng.integers(0, 50_000, (4, 257), dtype=np.int64)
    ids_np[0, 0], ids_np[0, 1] = 0, 49_999
    ids = torch.from_numpy(ids_np.copy()) if source == "torch" else ids_np.copy()
    with rlprobe.Probe(tmp_path / "d", rank=0, world_size=1) as probe:
        probe.save({"responses": ids})
        probe.step()
    dump = rlprobe.open(tmp_path / "d")
    row = dump.key_data().collect().row(0, named=True)
    assert row["dtype"] == "int64"
    on_disk = np.load(dump.path / row["tensor_file"], allow_pickle=False)
    assert on_disk.dtype.kind in "iu" and on_disk.dtype.itemsize < 8, on_disk.dtype
    assert np.array_equal(on_disk, ids_np)
    back = dump.tensor("responses", 0)
    assert back.dtype == np.int64
    assert np.array_equal(back, ids_np)


def test_a_call_of_many_small_tensors_of_one_layout(tmp_path):
    """The writer reduces a call's small tensors of one dtype and size as one stack, a chunk of
    ~1 MiB at a time: each row must still be its own tensor's, also across chunk boundaries."""
    gen = torch.Generator().manual_seed(3)
    values: dict[str, torch.Tensor] = {}
    for dtype in ("float32", "bfloat16", "int64", "bool", "float16"):
        for i in range(6):
            t = torch.randn(8, 8, generator=gen) * (i + 1)
            if i == 2 and dtype in FLOAT_NAMES:
                t[0, 0], t[1, 1], t[2, 2] = math.nan, math.inf, 0.0
            values[f"{dtype}_{i}"] = (t * 10).to(torch.int64) if dtype == "int64" else \
                (t > 0) if dtype == "bool" else t.to(TORCH_DTYPES[dtype])
    for i in range(3):  # 600 KB each: the chunks hold one or two of them
        values[f"big_{i}"] = torch.randn(150_000, generator=gen)
    save_and_check(values, {k: expected_from_torch(v) for k, v in values.items()}, tmp_path)
