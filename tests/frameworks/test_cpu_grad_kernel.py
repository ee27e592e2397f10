"""The CPU gradient kernel and the parameter fingerprint (frameworks/cpu_grad_kernel.pyx) against numpy, element by
element: max/min, norm, zero count, x <= bound counts and the packed signs of any float32/float64 array, special
values included, at every length around the lane, byte and chunk boundaries; the same bits at every vector width
the machine has; and errors that name what was expected."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from rlprobe.frameworks import cpu_grad_kernel as kernel
from rlprobe.frameworks.cpu_grad_kernel import CHUNK_BYTES, LANES, WIDTHS, fingerprint, stats_into
from rlprobe.lake.grad_stats import host_fingerprints

BOUNDS = np.array([-1.0, -1e-3, 0.0, 1e-3, 1.0], np.float64)
CHUNK = CHUNK_BYTES // 4  # float32 elements a chunk; float64: half as many
LENGTHS = [1, 7, 8, 9, LANES - 1, LANES + 1, CHUNK // 2 + 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + LANES + 5]


def _stats(x: np.ndarray, bounds: np.ndarray | None = BOUNDS) -> tuple[np.ndarray, np.ndarray]:
    nb = 0 if bounds is None else bounds.size
    row = np.full(4 + nb, -7.0)
    signs = np.full((x.size + 7) // 8 + 3, 0xAA, np.uint8)  # guard bytes around the range
    stats_into(x, bounds, row, signs, 1)
    assert signs[0] == 0xAA and (signs[1 + (x.size + 7) // 8:] == 0xAA).all()
    return row, signs[1:1 + (x.size + 7) // 8]


def _check(x: np.ndarray, bounds: np.ndarray | None = BOUNDS) -> None:
    row, signs = _stats(x, bounds)
    np.testing.assert_array_equal(signs, np.packbits(x > 0))
    if np.isnan(x).any():
        assert np.isnan(row[:3]).all()
    else:
        assert row[0] == x.max() and row[1] == x.min()
        # -0.0 sorts below +0.0
        if row[0] == 0:
            assert np.signbit(row[0]) == (not (x == 0)[~np.signbit(x)].any())
        if row[1] == 0:
            assert np.signbit(row[1]) == bool(np.signbit(x[x == 0]).any())
        with np.errstate(over="ignore"):
            want = float(x.dtype.type(np.sqrt(np.sum(x.astype(np.float64) ** 2))))
        assert row[2] == pytest.approx(want, rel=1e-6) or (np.isinf(want) and row[2] == want)
    assert row[3] == np.count_nonzero(x == 0)
    for j, b in enumerate(np.zeros(0) if bounds is None else bounds.astype(x.dtype)):
        assert row[4 + j] == np.count_nonzero(x <= b)


def _check_fingerprint(values: np.ndarray, raw: np.ndarray | None = None) -> None:
    words = None
    if raw is not None:  # a 16-bit array: its bytes, padded to whole 32-bit words, beside its float32 values
        b = raw.view(np.uint8)
        words = np.concatenate([b, np.zeros(-b.size % 4, np.uint8)]).view(np.uint32)
    digest, s, norm = fingerprint(values, words)
    want = host_fingerprints([values], None if raw is None else [raw])
    assert digest == int(want.digests[0])
    scale = float(np.abs(values.astype(np.float64)).sum())  # the sums' rounding, whatever the order
    np.testing.assert_allclose([s, norm], want.floats[0], rtol=1e-12, atol=1e-14 * scale)


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(st.sampled_from([np.float32, np.float64]), st.integers(1, 3 * CHUNK + 9),
                  elements=st.floats(allow_nan=True, allow_infinity=True, width=32)))
def test_matches_numpy(x):
    _check(x)
    if np.isfinite(x).all():
        _check_fingerprint(x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("values", [
    [-3.0, -0.5, -2.0],  # all negative: max is the negative of smallest magnitude
    [0.25, 4.0, 1.0],  # all positive
    [-0.0], [0.0], [0.0, -0.0], [-0.0, -1.0], [0.0, 1.0, -0.0],
    [np.inf, -np.inf, 1.0], [-np.inf], [np.inf],
    [np.nan, 1.0], [-np.nan, -1.0],
    [1e-45, -1e-45], [np.finfo(np.float32).max, -np.finfo(np.float32).max],
])
def test_special_values(dtype, values):
    _check(np.array(values, dtype))


@pytest.mark.parametrize("bounds", [None, np.array([0.0]), np.array([-1, 0, 1], np.float32), BOUNDS,
                                    np.linspace(-2, 2, 17)])
def test_any_number_of_bounds(bounds):
    x = np.random.default_rng(3).standard_normal(CHUNK + 77).astype(np.float32)
    _check(x, bounds)
    _check(x.astype(np.float64), bounds)


@pytest.mark.parametrize("n", LENGTHS)
def test_lengths_around_lane_chunk_and_byte_edges(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    x[::5] = 0
    x[1::7] = -0.0
    for a in (x, x.astype(np.float64)):
        _check(a)
        _check(-np.abs(a) - 1)  # no non-negative value at all
        _check_fingerprint(a)


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
@pytest.mark.parametrize("n", [1, 2, 3, LANES + 3, CHUNK + 1])
def test_fingerprint_of_16_bit_values_digests_their_own_bytes(dtype, n):
    if dtype == "bfloat16":
        torch = pytest.importorskip("torch")
        t = torch.randn(n).to(torch.bfloat16)
        raw, values = t.view(torch.int16).numpy(), t.float().numpy()
    else:
        raw = np.random.default_rng(n).standard_normal(n).astype(np.float16)
        values = raw.astype(np.float32)
    _check_fingerprint(values, raw)


def test_fingerprint_of_an_empty_array_and_of_special_values():
    assert fingerprint(np.zeros(0, np.float32)) == (0, 0.0, 0.0)
    digest, s, norm = fingerprint(np.array([np.inf, 1.0, -0.0], np.float32))
    assert digest == int(host_fingerprints([np.array([np.inf, 1.0, -0.0], np.float32)]).digests[0])
    assert s == np.inf and norm == np.inf
    assert np.isnan(fingerprint(np.array([np.inf, -np.inf]))[1])


def test_every_width_gives_the_same_bits():
    """The float sums run in fixed lanes: a narrower vector width adds the same lanes in the same order."""
    rng = np.random.default_rng(7)
    arrays = [(rng.standard_normal(n) * rng.uniform(1e-3, 1e3)).astype(dt)
              for n in (3, LANES + 5, CHUNK + 3, 5 * CHUNK + 2 * LANES + 7) for dt in (np.float32, np.float64)]
    words = rng.integers(0, 2**32, 1001, dtype=np.uint64).astype(np.uint32)

    def results() -> list:
        out = []
        for a in arrays:
            row, signs = _stats(a)
            out += [row.tobytes(), signs.tobytes(), fingerprint(a)]
        return out + [fingerprint(arrays[-1].astype(np.float32), words)]

    before = kernel.use_width(WIDTHS[0])
    try:
        per_width = {}
        for width in WIDTHS:
            kernel.use_width(width)
            per_width[width] = results()
    finally:
        kernel.use_width(before)
    assert len(per_width) >= 1
    for width, got in per_width.items():
        assert got == per_width[WIDTHS[0]], width


def _fixed_lane_sum(terms: np.ndarray) -> float:
    """The kernel's order (cpu_grad_kernel.h): term i into lane i % LANES, in order; then lane k += lane k + w."""
    lanes = np.zeros(LANES)
    for row in np.concatenate([terms, np.zeros(-terms.size % LANES)]).reshape(-1, LANES):
        lanes += row
    w = LANES // 2
    while w:
        lanes[:w] += lanes[w:2 * w]
        w //= 2
    return float(lanes[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_sums_are_added_in_the_documented_order(dtype):
    """Bit for bit: the order is the kernel's contract, the same on every machine (docs/grads.md)."""
    rng = np.random.default_rng(11)
    for n in (1, LANES + 3, 3 * CHUNK + 5):
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)).astype(dtype)
        wide = x.astype(np.float64)
        _, s, norm = fingerprint(x)
        assert s == _fixed_lane_sum(wide) and norm == np.sqrt(_fixed_lane_sum(wide * wide))
        row, _ = _stats(x, None)
        assert row[2] == float(dtype(np.sqrt(_fixed_lane_sum(wide * wide))))


def test_bad_input_is_an_error_naming_what_was_expected():
    row, signs = np.zeros(9), np.zeros(8, np.uint8)
    expected = "expected a 1-D C-contiguous float32 or float64 numpy array, got "
    for bad, got in [(np.zeros(4, np.float16), "a 1-D C-contiguous float16 array"),
                     (np.zeros(4, np.int32), "a 1-D C-contiguous int32 array"),
                     (np.zeros(8, np.float32)[::2], "a 1-D not C-contiguous float32 array"),
                     (np.zeros((2, 2), np.float64), "a 2-D C-contiguous float64 array"),
                     ([1.0, 2.0], "list")]:
        with pytest.raises(TypeError, match=f"stats_into: {expected}{got}"):
            stats_into(bad, BOUNDS, row, signs, 0)
        with pytest.raises(TypeError, match=f"fingerprint: {expected}{got}"):
            fingerprint(bad)
    x = np.ones(20, np.float32)
    with pytest.raises(ValueError, match="the array is empty"):
        stats_into(np.zeros(0, np.float32), BOUNDS, row, signs, 0)
    with pytest.raises(ValueError, match="row has 6 entries; 5 bounds need 9"):
        stats_into(x, BOUNDS, np.zeros(6), signs, 0)
    with pytest.raises(TypeError, match="row: expected a writable 1-D C-contiguous float64 array, got .* float32"):
        stats_into(x, BOUNDS, np.zeros(9, np.float32), signs, 0)
    with pytest.raises(ValueError, match="20 sign bits at byte 6 do not fit in 8 bytes"):
        stats_into(x, BOUNDS, row, signs, 6)
    with pytest.raises(TypeError, match="signs: expected a writable 1-D C-contiguous uint8 array, got .* int8"):
        stats_into(x, BOUNDS, row, np.zeros(8, np.int8), 0)
    with pytest.raises(TypeError, match="words: expected a 1-D C-contiguous uint32 array, got .* int32"):
        fingerprint(x, np.zeros(3, np.int32))
    read_only = np.zeros(9)
    read_only.flags.writeable = False
    with pytest.raises(TypeError, match="row: expected a writable .* got a 1-D C-contiguous read-only float64"):
        stats_into(x, BOUNDS, read_only, signs, 0)
    with pytest.raises(ValueError, match="not one of this machine's widths"):
        kernel.use_width("avx9000")
