"""CUDA tensors: statistics on the device, pinned non-blocking copies, no sync on the training thread.

Runs where a GPU exists (skipped elsewhere: the only skip the project allows)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

import rlprobe

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _cases():
    g = torch.Generator(device="cpu").manual_seed(0)
    f = torch.randn(64, 33, generator=g)
    f[0, 0], f[1, 1], f[2, 2], f[3, 3] = float("nan"), float("inf"), float("-inf"), -0.0
    return {
        "f32": f,
        "bf16": f.to(torch.bfloat16),
        "f16": f.to(torch.float16),
        "f64": f.double(),
        "fp8": torch.randn(8, 8, generator=g).to(torch.float8_e4m3fn),
        "tokens": torch.randint(0, 50000, (16, 40), generator=g),
        "mask": torch.rand(5, 7, generator=g) > 0.5,
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(2.5),
        "transposed": torch.arange(24, dtype=torch.float32).reshape(4, 6).t(),
    }


def _raw(t: torch.Tensor) -> np.ndarray:
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy()
    return t.numpy()


def _wide(t: torch.Tensor) -> np.ndarray:
    if t.dtype in (torch.bfloat16, torch.float16, torch.float8_e4m3fn):
        return t.float().numpy()
    return t.contiguous().numpy()


@pytest.mark.parametrize("stats_only", [False, True])
def test_cuda_stats_hash_and_tensors(tmp_path, stats_only):
    cpu = _cases()
    with rlprobe.Probe(tmp_path / "d", stats_only=stats_only) as probe:
        probe.save({k: v.cuda() for k, v in cpu.items()})
        probe.step()
    d = rlprobe.open(tmp_path / "d")
    rows = {r["key"]: r for r in d.arrow("key_data").to_pylist()}
    for key, t in cpu.items():
        row = rows[key]
        v = _wide(t).astype(np.float64)
        assert row["dtype"] == str(t.dtype).removeprefix("torch."), key
        assert row["shape"] == list(t.shape) and row["numel"] == t.numel()
        assert row["nan_count"] == int(np.isnan(v).sum()) and row["inf_count"] == int(np.isinf(v).sum())
        assert row["zero_count"] == int((v == 0).sum()), key
        if v.size:
            np.testing.assert_equal(row["min"], np.min(v))
            np.testing.assert_equal(row["max"], np.max(v))
            np.testing.assert_allclose(row["mean"], np.mean(v), rtol=1e-9, equal_nan=True)
            np.testing.assert_allclose(row["norm"], np.sqrt(np.sum(v * v)), rtol=1e-9, equal_nan=True)
        if stats_only:
            assert row["tensor_file"] is None and row["hash"] is None
        else:
            assert row["hash"] == hashlib.blake2b(_raw(t).tobytes(), digest_size=16).hexdigest(), key
            back = d.tensor(key, 0)
            expect = _wide(t) if t.dtype not in (torch.int64, torch.bool) else t.numpy()
            assert back.dtype == expect.dtype, key
            np.testing.assert_array_equal(back, expect)


def test_save_does_not_synchronise_the_training_thread(tmp_path):
    x = torch.randn(64, 4096, device="cuda")
    probe = rlprobe.Probe(tmp_path / "d")
    probe.save({"warm": x})  # first call may allocate pinned pages
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(4):
            probe.save({"log_prob": x, "responses": torch.randint(0, 9, (64, 4096), device="cuda")})
    finally:
        torch.cuda.set_sync_debug_mode("default")
    probe.close()
    assert rlprobe.open(tmp_path / "d").arrow("key_data").num_rows == 9


def test_in_place_change_after_save_is_not_seen(tmp_path):
    x = torch.zeros(1024, device="cuda")
    with rlprobe.Probe(tmp_path / "d") as probe:
        probe.save({"x": x})
        x.add_(1.0)  # same stream, after the copy was queued
        probe.save({"x": x})
    d = rlprobe.open(tmp_path / "d")
    assert d.tensor("x", 0, micro_step=0).max() == 0.0 and d.tensor("x", 0, micro_step=1).min() == 1.0


# -- gradient monitors and stage hooks on the GPU (issues 4 and 6) -------------------------------
def test_grad_kernel_on_cuda_equals_the_host_kernel():
    from rlprobe.lake.grad_stats import host_batch, mix64_numpy
    from rlprobe.frameworks.torch_grads import launch

    g = torch.Generator(device="cpu").manual_seed(5)
    grads = [torch.randn(257, 33, generator=g), torch.zeros(7), torch.randn(1, generator=g),
             torch.randn(9, generator=g).to(torch.bfloat16), torch.empty(0)]
    grads[0][0, 0] = -0.0
    for level in ("L0", "L1", "L2"):
        got = launch([t.cuda() for t in grads], level, [-0.5, 0.0, 0.5])[0]()
        want = host_batch([t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy() for t in grads],
                          level, [-0.5, 0.0, 0.5])
        np.testing.assert_allclose(got.stats, want.stats, rtol=1e-6, equal_nan=True)
        if level != "L0":
            assert np.array_equal(got.signs, want.signs) and got.sign_offsets == want.sign_offsets
        else:  # digests are of the raw bytes: bf16's own, where the host reference saw float32
            assert np.array_equal(np.delete(got.digests, 3), np.delete(want.digests, 3))
            assert int(got.digests[3]) == mix64_numpy(grads[3].view(torch.int16).numpy())


def test_monitor_grads_on_cuda_matches_cpu_and_does_not_synchronise(tmp_path):
    def train(device, path, check_sync):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 129), torch.nn.ReLU(), torch.nn.Linear(129, 7)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator(device="cpu").manual_seed(1)
        xs = [torch.randn(16, 64, generator=g).to(device) for _ in range(3)]
        with rlprobe.Probe(path) as probe:
            monitor = probe.monitor_grads(model, optimizer=opt, name="actor", level="L2", bounds=[-0.1, 0.0, 0.1])
            for i, x in enumerate(xs):
                opt.zero_grad()
                model(x).pow(2).mean().backward()
                if check_sync and i > 0:  # the first step may allocate pinned memory
                    torch.cuda.set_sync_debug_mode("error")
                try:
                    opt.step()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                probe.step()
            if device == "cuda":  # the fused kernel ran, not the torch-ops fallback
                assert type(monitor._kernels["triton"]).__name__ == "GradStatsKernel"

    train("cpu", tmp_path / "cpu", False)
    train("cuda", tmp_path / "cuda", True)
    key = lambda r: (r["step"], r["param"])  # noqa: E731
    cpu = sorted(rlprobe.open(tmp_path / "cpu").arrow("grad").to_pylist(), key=key)
    gpu = sorted(rlprobe.open(tmp_path / "cuda").arrow("grad").to_pylist(), key=key)
    assert [key(r) for r in cpu] == [key(r) for r in gpu] and len(gpu) == 3 * 4
    for c, d in zip(cpu, gpu):
        for field in ("max", "min", "norm", "zero_fraction"):
            assert d[field] == pytest.approx(c[field], rel=1e-4, abs=1e-7), (key(c), field)
        assert d["numel"] == c["numel"] and d["sign_offset"] == c["sign_offset"]


def test_stage_hooks_on_cuda_dump_the_same_module_tensors_as_on_cpu(tmp_path):
    def run(device, path):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(device)
        x = torch.randn(8, 16).to(device)
        with rlprobe.Probe(path) as probe:
            with probe.stage("actor_update", model=model, tensors=True):
                model(x).pow(2).mean().backward()
            probe.step()
        return rlprobe.open(path).arrow("module").to_pylist()

    cpu, gpu = run("cpu", tmp_path / "cpu"), run("cuda", tmp_path / "cuda")
    key = lambda r: (r["module"], r["call"], r["direction"], r["io"], r["index"])  # noqa: E731
    assert sorted(map(key, cpu)) == sorted(map(key, gpu)) and any(r["direction"] == "backward" for r in gpu)
    by_key = {key(r): r for r in cpu}
    for r in gpu:
        c = by_key[key(r)]
        assert r["tensor_file"] and r["shape"] == c["shape"]
        np.testing.assert_allclose(np.load(tmp_path / "cuda" / r["tensor_file"]),
                                   np.load(tmp_path / "cpu" / c["tensor_file"]), rtol=1e-4, atol=1e-5)


# -- the fused Triton gradient kernel (issue 17) ------------------------------------------------
def _grad_cases() -> list[torch.Tensor]:
    """Gradients around every edge of the kernel: sizes around bytes, tiles and chunks, special
    values, three dtypes, an empty one, and Megatron-like main_grad views into one flat buffer
    (one of them not 16-byte aligned, which turns vector loads off)."""
    from rlprobe.frameworks.triton_grad_kernel import BLOCK, CHUNK

    g = torch.Generator(device="cpu").manual_seed(7)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-40, -1e-45, 3.4e38, 5e19])
    cases = [torch.randn(n, generator=g) for n in (1, 7, 8, 9, BLOCK - 1, BLOCK + 1, CHUNK + 3, 300_001)]
    cases[4][::5] = 0.0
    cases[5][3] = -0.0
    cases += [special, special[1:], special[1:].to(torch.bfloat16), special[3:].half(), torch.empty(0),
              torch.randn(70_000, generator=g).to(torch.bfloat16), torch.randn(4099, generator=g).half(),
              -torch.rand(33, generator=g) - 1, torch.randn(257, 33, generator=g)]
    flat = torch.randn(20_000, generator=g)
    cases += [flat[0:4096], flat[4096:9095], flat[9095:20_000]]  # the last view starts 12 bytes past 16
    return cases


def _compare_with_host(batch, cpu: list[torch.Tensor], bounds) -> None:
    from rlprobe.lake.grad_stats import host_batch

    wide = [t.float().numpy().reshape(-1) for t in cpu]
    with np.errstate(over="ignore"):
        want = host_batch(wide, "L2" if bounds is not None else "L1", bounds or [])
    assert np.array_equal(batch.signs, want.signs) and batch.sign_offsets == want.sign_offsets
    assert np.array_equal(batch.stats[:, 3:], want.stats[:, 3:])  # zero and bound counts
    for r, v in enumerate(wide):
        row = batch.stats[r]
        if v.size == 0 or np.isnan(v).any():
            assert np.isnan(row[:3]).all(), r
            continue
        assert row[0] == v.max() and row[1] == v.min(), r
        with np.errstate(over="ignore"):
            exact = float(np.float32(np.sqrt(np.sum(v.astype(np.float64) ** 2))))
        assert row[2] == pytest.approx(exact, rel=1e-6) or row[2] == exact == np.inf, r


@pytest.mark.parametrize("shape", [None, (1024, 4), (4096, 16)])
def test_triton_grad_kernel_on_cuda_equals_the_numpy_reference(shape):
    from rlprobe.frameworks.triton_grad_kernel import GradStatsKernel

    cpu = _grad_cases()
    kernel = GradStatsKernel() if shape is None else GradStatsKernel(block=shape[0], chunk=16 * shape[0],
                                                                      num_warps=shape[1])
    flat = cpu[-1]._base.cuda()  # the views share one buffer on the GPU too
    gpu = [t.cuda() for t in cpu[:-3]] + [flat[0:4096], flat[4096:9095], flat[9095:20_000]]
    assert gpu[-1].data_ptr() % 16 == 12
    for bounds in (None, [-1.0, -1e-3, 0.0, 1e-3, 1.0]):
        finish, nbytes = kernel.launch(gpu, bounds)
        batch = finish()
        try:
            assert nbytes == batch.stats.nbytes + batch.signs.nbytes
            _compare_with_host(batch, cpu, bounds)
        finally:
            batch.release()


def test_triton_grad_path_allocates_nothing_per_step_and_does_not_synchronise():
    """torch_grads.launch on CUDA picks the Triton kernel; after the first step it allocates no
    device memory (buffers kept in the monitor's dict) and never synchronises the host."""
    from rlprobe.frameworks.torch_grads import launch
    from rlprobe.frameworks.triton_grad_kernel import GradStatsKernel

    cpu = _grad_cases()[:12]
    grads = [t.cuda() for t in cpu]
    kernels: dict = {}
    launch(grads, "L2", [-1.0, 0.0, 1.0], kernels)[0]().release()
    assert isinstance(kernels["triton"], GradStatsKernel)
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    finishes = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            finishes.append(launch(grads, "L2", [-1.0, 0.0, 1.0], kernels)[0])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    for finish in finishes:
        batch = finish()
        _compare_with_host(batch, cpu, [-1.0, 0.0, 1.0])
        batch.release()
