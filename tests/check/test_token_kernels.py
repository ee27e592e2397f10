"""The Cython token kernels (rlprobe/checks/kernels.pyx, token_loops.h) against a plain numpy reduction on random
and edge inputs (NaN, ±inf, masks all 0 and all 1, widths across the 8-token chunks and the position buckets),
and the same bits at every instruction set the CPU runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlprobe.checks import kernels
from rlprobe.checks.compiled import kernel_arrays, reduce_pair
from rlprobe.checks.token_figures import LOG_THRESHOLDS, N_BINS, N_POSITIONS, N_PROBABILITY, PairFigures
from rlprobe.checks.token_maxima import reduce_maxima

EPS = 0.2


def isa_levels() -> list[int]:
    """The instruction sets this CPU runs (0: the default build, 1: AVX2, 2: AVX-512)."""
    levels = []
    for level in (0, 1, 2):
        try:
            kernels.use_isa(level)
            levels.append(level)
        except ValueError:
            pass
    kernels.use_isa()
    return levels


@pytest.fixture(params=isa_levels())
def isa(request):
    yield kernels.use_isa(request.param)
    kernels.use_isa()


def cases():
    """(a, b, mask) of every dtype pair: widths 0 .. 9,000 tokens (odd ones, a partial last chunk), NaN and ±inf
    inside and outside the mask, masks all 0 and all 1, exact zeros, Δ far below and above float32's range."""
    rng = np.random.default_rng(23)
    out = []
    for i, (rows, width) in enumerate([(1, 1), (2, 3), (3, 7), (2, 8), (4, 9), (1, 17), (5, 100), (2, 1000), (3, 4099),
                                       (1, 9000), (3, 0)]):
        for da, db in ((np.float32, np.float32), (np.float64, np.float64), (np.float32, np.float64)):
            a = (-rng.random((rows, width)) * 6).astype(da)
            b = (a + rng.normal(0, [0.02, 1e-7, 3.0][i % 3], a.shape)).astype(db)
            mask = [rng.random(a.shape) > 0.3, np.ones(a.shape, bool), np.zeros(a.shape, bool)][i % 3]
            if a.size > 4:
                flat = b.reshape(-1)
                flat[rng.integers(0, a.size, 3)] = [np.nan, np.inf, -np.inf]
                flat[rng.integers(0, a.size, 2)] = a.reshape(-1)[:2]  # exact zeros where they line up
                if db is np.float64:
                    flat[0] = a.reshape(-1)[0] + 1e-300  # below float32's smallest denormal
                    flat[-1] = 1e300  # above float32's largest
            out.append((a, b, mask))
    return out


def reference(a, b, mask) -> dict:
    """The figures of token_figures.py by numpy, token by token."""
    d = b.astype(np.float64) - a.astype(np.float64)
    counted = (mask != 0) & np.isfinite(d)
    dm, ad = d[counted], np.abs(d[counted])
    with np.errstate(over="ignore"):
        near = dm.astype(np.float32)
    bins = (near.view(np.uint32) - (np.abs(near.astype(np.float64)) > ad)) >> 17
    positions = np.broadcast_to(np.arange(a.shape[1]), a.shape)[counted]
    bucket = np.minimum(np.where(positions == 0, 0, np.floor(np.log2(np.maximum(positions, 1))) + 1),
                        N_POSITIONS - 1).astype(int)
    prob = (a.astype(np.float64)[counted][:, None] >= LOG_THRESHOLDS).sum(axis=1)
    with np.errstate(over="ignore"):  # Δ = 1e300: Δ² is inf, in the kernel too
        square = (dm * dm).sum()
    return {"tokens": dm.size, "sum_delta": dm.sum(), "sum_sq": square, "sum_abs": ad.sum(),
            "max_abs": ad.max(initial=0.0), "outside": np.count_nonzero((dm < math.log(1 - EPS)) | (dm > math.log(1 + EPS))),
            "nonfinite": np.count_nonzero((mask != 0) & ~np.isfinite(d)),
            "hist": np.bincount(bins, minlength=N_BINS), "pos_count": np.bincount(bucket, minlength=N_POSITIONS),
            "pos_sum": np.bincount(bucket, ad, minlength=N_POSITIONS),
            "pos_max": np.array([ad[bucket == k].max(initial=0.0) for k in range(N_POSITIONS)]),
            "prob_count": np.bincount(prob, minlength=N_PROBABILITY), "prob_sum": np.bincount(prob, ad, minlength=N_PROBABILITY),
            "seq_sum": np.where(counted, d, 0).sum(axis=1), "seq_n": counted.sum(axis=1)}


def figures(a, b, mask) -> dict:
    f, seq_sum, seq_n = reduce_pair(a, b, EPS, mask)
    return {**{k: v for k, v in vars(f).items()}, "seq_sum": seq_sum, "seq_n": seq_n}


EXACT = ("tokens", "max_abs", "outside", "nonfinite", "hist", "pos_count", "pos_max", "prob_count", "seq_n")


def test_the_figures_equal_numpy(isa):
    for a, b, mask in cases():
        got, want = figures(a, b, mask), reference(a, b, mask)
        for name, value in want.items():
            if name in EXACT:
                assert np.array_equal(got[name], value), (isa, a.shape, a.dtype, b.dtype, name)
            else:
                assert np.allclose(got[name], value, rtol=1e-12, atol=1e-300), (isa, a.shape, name)
        assert reduce_maxima(a, b, mask) == (want["tokens"], want["max_abs"], want["nonfinite"]), (isa, a.shape)


def test_every_instruction_set_gives_the_same_bits():
    levels = isa_levels()
    try:
        for a, b, mask in cases():
            runs = []
            for level in levels:
                kernels.use_isa(level)
                runs.append((figures(a, b, mask), reduce_maxima(a, b, mask)))
            for got, maxima in runs[1:]:
                assert maxima == runs[0][1]
                for name, value in got.items():
                    assert np.asarray(value).tobytes() == np.asarray(runs[0][0][name]).tobytes(), (a.shape, name)
    finally:
        kernels.use_isa()


def test_an_instruction_set_the_cpu_lacks_or_unknown_is_refused():
    with pytest.raises(ValueError, match="does not run instruction set 3"):
        kernels.use_isa(3)
    assert kernels.use_isa() in ("default", "avx2", "avx512")


def test_arrays_of_other_shapes_are_refused_not_read_past():
    a, b, m = kernel_arrays(np.zeros((2, 8), np.float32), np.zeros((2, 8), np.float32), None)
    f = PairFigures()
    with pytest.raises(ValueError, match="shapes differ"):
        kernels.reduce_rows(a, b[:1], m, -0.1, 0.1, np.zeros(N_BINS, np.int8), LOG_THRESHOLDS, np.zeros(7), f.hist,
                            None, f.pos_count, f.pos_sum, f.pos_max, f.prob_count, f.prob_sum, np.zeros(2),
                            np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="sizes differ"):
        kernels.reduce_maxima(a.reshape(-1), b.reshape(-1)[:3], m.reshape(-1), np.zeros(3, np.int64))
