"""The Triton gradient kernel (frameworks/triton_grad_kernel.py) against the numpy reference
(lake/grad_stats.host_batch), on CPU tensors under the Triton interpreter.

Triton picks the interpreter when it is imported and when each kernel is decorated, for its own
library as well, so these tests need a process started with TRITON_INTERPRET=1: they are not
collected by the suite (no test_ prefix) but run by test_triton_grad_kernel.py in a subprocess,
which leaves the suite's process (and any compiled kernels it uses) untouched.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from rlprobe.lake.grad_stats import host_batch
from rlprobe.frameworks import staging

if os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("run with TRITON_INTERPRET=1 (tests/frameworks/test_triton_grad_kernel.py does)")

import rlprobe.frameworks.triton_grad_kernel as triton_kernel  # noqa: E402  (after the check)


def _key(v: np.ndarray) -> np.ndarray:
    """float32 -> int64 keys in the kernel's order (-0.0 below +0.0)."""
    i = v.astype(np.float32).view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF) - 1, i)


def _check(kernel, tensors: list[torch.Tensor], bounds: list[float] | None) -> None:
    """Launch, then compare every output with host_batch on the float32 values."""
    finish, nbytes = kernel.launch(tensors, bounds)
    got = finish()
    try:
        wide = [t.float().numpy().reshape(-1) for t in tensors]
        with np.errstate(over="ignore"):  # host_batch's float32 norm of |x| > 1.8e19
            want = host_batch(wide, "L2" if bounds is not None else "L1", bounds or [])
        k = 4 + (len(bounds) if bounds is not None else 0)
        assert got.stats.shape == (len(tensors), k) and got.digests is None
        assert got.sign_offsets == want.sign_offsets
        assert got.signs.dtype == np.uint8 and np.array_equal(got.signs, want.signs)
        assert nbytes == got.stats.nbytes + got.signs.nbytes
        # counts exactly: zeros, then x <= bound per bound
        assert np.array_equal(got.stats[:, 3:], want.stats[:, 3:])
        for r, v in enumerate(wide):
            row, ref = got.stats[r], want.stats[r]
            if v.size == 0 or np.isnan(v).any():
                assert np.isnan(row[:3]).all(), r
                continue
            # max and min bit for bit, -0.0 below +0.0
            keys = _key(v)
            for col, at in ((0, int(np.argmax(keys))), (1, int(np.argmin(keys)))):
                assert row[col] == ref[col]
                assert np.float64(row[col]).view(np.int64) == np.float64(v[at]).view(np.int64), (r, col)
            with np.errstate(over="ignore"):
                exact = float(np.float32(np.sqrt(np.sum(v.astype(np.float64) ** 2))))
            assert row[2] == pytest.approx(exact, rel=1e-6) or row[2] == exact == np.inf
            if np.isfinite(ref[2]):  # host_batch's float32 dot overflows for |x| > 1.8e19
                assert row[2] == pytest.approx(ref[2], rel=1e-6)
    finally:
        got.release()


DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@st.composite
def gradient_lists(draw):
    n = draw(st.integers(1, 4))
    tensors = []
    for _ in range(n):
        size = draw(st.one_of(st.integers(0, 9), st.integers(30, 200), st.sampled_from([63, 64, 65, 128, 129])))
        values = draw(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=size,
                               max_size=size))
        values += [0.0] * (size - len(values))
        tensors.append(torch.tensor(values, dtype=torch.float32).to(draw(st.sampled_from(DTYPES))))
    bounds = draw(st.one_of(st.none(), st.lists(st.floats(-2, 2, width=32), min_size=1, max_size=5, unique=True)))
    return tensors, sorted(bounds) if bounds is not None else None


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=gradient_lists(), shape=st.sampled_from([(16, 32), (32, 64)]))
def test_triton_kernel_matches_numpy_reference(case, shape):
    tensors, bounds = case
    _check(triton_kernel.GradStatsKernel(block=shape[0], chunk=shape[1], num_warps=1), tensors, bounds)


@pytest.mark.parametrize("bounds", [None, [-1.0, -0.001, 0.0, 0.001, 1.0]])
def test_triton_kernel_special_values_and_byte_edges(bounds):
    specials = [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-45, -1e-45, 3.4e38, -3.4e38, 5e19]
    tensors = [
        torch.tensor([-0.0]), torch.tensor([0.0, -0.0]), torch.tensor([-3.0, -0.5, -2.0]),
        torch.tensor([float("inf"), -float("inf"), 1.0]), torch.tensor([float("nan"), 1.0]).to(torch.bfloat16),
        torch.tensor(specials[1:]), torch.tensor([65504.0, -70000.0, 1e-8]).half(), torch.empty(0),
        torch.tensor([-0.0, -1.0]).to(torch.bfloat16), torch.linspace(-3, 3, 7),  # 7, 8 and 9: byte edges
        torch.linspace(-3, 3, 8).half(), torch.linspace(-3, 3, 9),
        # subnormals are values: not zero, signs set (the interpreter's bf16 cast would flush them)
        torch.tensor([-9.18e-41, 1e-40, -1e-45]).to(torch.bfloat16), torch.tensor([1e-40, -1e-45, 0.0]),
        torch.tensor([6e-8, -6e-8]).half(),
        torch.linspace(-2, 2, 63).reshape(7, 9), torch.linspace(-2, 2, 24).reshape(2, 3, 4).half(),  # memory order
    ]
    _check(triton_kernel.GradStatsKernel(block=16, chunk=32, num_warps=1), tensors, bounds)


def test_triton_kernel_default_launch_shape_across_chunks():
    """The shipped BLOCK/CHUNK, gradients of two dtypes interleaved (one stage-one launch each),
    lengths one short of and past a chunk."""
    mod = triton_kernel
    g = torch.Generator().manual_seed(3)
    a = torch.randn(mod.CHUNK + 9, generator=g)
    a[::7] = 0.0
    a[5] = -0.0
    tensors = [a, torch.randn(mod.CHUNK - 1, generator=g).to(torch.bfloat16), torch.randn(5, generator=g),
               torch.randn(mod.BLOCK + 1, generator=g).to(torch.bfloat16)]
    _check(mod.GradStatsKernel(), tensors, [-1.0, 0.0, 1.0])


def test_triton_kernel_reuses_its_buffers_and_follows_moved_gradients():
    """Steps with the same layout allocate nothing new; gradients reallocated between steps
    (zero_grad(set_to_none=True)) are read at their new addresses."""
    kernel = triton_kernel.GradStatsKernel(block=16, chunk=32, num_warps=1)
    g = torch.Generator().manual_seed(4)
    first = [torch.randn(50, generator=g), torch.randn(3, generator=g).to(torch.bfloat16)]
    _check(kernel, first, [0.0])
    layout, payload = kernel._layout, kernel._layout.payload.data_ptr()
    moved = [torch.randn(50, generator=g) * 10, torch.randn(3, generator=g).to(torch.bfloat16)]
    assert moved[0].data_ptr() != first[0].data_ptr()
    _check(kernel, moved, [0.0])
    first[0].mul_(-1)  # same addresses, new values
    _check(kernel, first, [0.0])
    assert kernel._layout is layout and layout.payload.data_ptr() == payload
    assert layout.addrs == tuple(t.data_ptr() for t in first)
    _check(kernel, first + [torch.ones(4)], [0.0])  # a new layout: new buffers
    assert kernel._layout is not layout


def test_triton_kernel_results_live_in_a_ring_slot_until_released():
    kernel = triton_kernel.GradStatsKernel(block=16, chunk=32, num_warps=1)
    ring = staging.host_ring()
    live = len(ring._live)
    batch = kernel.launch([torch.arange(-5.0, 20.0)], None)[0]()
    assert len(ring._live) == live + 1 and batch.release is not None
    assert batch.stats[0, 0] == 19.0 and batch.stats[0, 3] == 1 and batch.signs.size == 4
    assert batch.signs.ctypes.data - ring.buffer.ctypes.data in range(ring.capacity)
    batch.release()
    assert len(ring._live) == live


def test_triton_kernel_refuses_what_it_cannot_read():
    kernel = triton_kernel.GradStatsKernel(block=16, chunk=32, num_warps=1)
    assert not kernel.supports([torch.ones(3, dtype=torch.float64)])
    assert not kernel.supports([torch.ones(4, 3).t()]) and kernel.supports([torch.ones(4, 3), torch.ones(2).half()])
    with pytest.raises(ValueError, match="float64"):
        kernel.launch([torch.ones(3, dtype=torch.float64)], None)
    with pytest.raises(ValueError, match="block=12"):
        triton_kernel.GradStatsKernel(block=12)
