"""The accelerator staging path (stacked statistics, one raw buffer per call), run on the CPU
so CI checks its bookkeeping; tests/frameworks/test_torch_cuda.py runs it on a GPU."""

from __future__ import annotations

import numpy as np
import torch

from rlprobe.frameworks.torch_adapter import TorchAdapter
from rlprobe.lake.encoding import widen
from rlprobe.lake.statistics import host_statistics


def test_stacked_staging_matches_host_statistics_and_bytes():
    g = torch.Generator().manual_seed(1)
    f = torch.randn(6, 5, generator=g)
    f[0, 0], f[1, 1] = float("nan"), float("-inf")
    tensors = [
        f, torch.randn(6, 5, generator=g), f.to(torch.bfloat16), torch.randint(0, 70000, (30,), generator=g),
        torch.rand(3, 3, generator=g) > 0.5, torch.empty(0, 2), torch.tensor(3.0), f.t(),
        torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
    ]
    leaves = [None] * len(tensors)
    TorchAdapter()._stage_on_device(torch.device("cpu"), tensors, True, list(range(len(tensors))), leaves)
    for t, leaf in zip(tensors, leaves):
        leaf.finish()
        assert leaf.shape == tuple(t.shape)
        values = widen(leaf.raw, leaf.dtype)
        expect = t.float().numpy() if t.dtype in (torch.bfloat16, torch.float8_e4m3fn) else t.contiguous().numpy()
        np.testing.assert_array_equal(values, expect)
        assert leaf.device_stats is None  # computed from the host copy by the writer


def test_stats_only_device_statistics_match_host_statistics():
    g = torch.Generator().manual_seed(1)
    f = torch.randn(6, 5, generator=g)
    f[0, 0], f[1, 1], f[2, 2] = float("nan"), float("-inf"), -0.0
    tensors = [
        f, torch.randn(6, 5, generator=g), f.to(torch.bfloat16), torch.randint(0, 70000, (30,), generator=g),
        torch.rand(3, 3, generator=g) > 0.5, torch.empty(0, 2), torch.tensor(3.0), f.t(),
        torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
    ]
    leaves = [None] * len(tensors)
    TorchAdapter()._stage_on_device(torch.device("cpu"), tensors, False, list(range(len(tensors))), leaves)
    for t, leaf in zip(tensors, leaves):
        leaf.finish()
        assert leaf.raw is None
        values = t.float().numpy() if t.dtype in (torch.bfloat16, torch.float8_e4m3fn) else t.contiguous().numpy()
        host = host_statistics(values)
        for name, value in host.items():
            if value is None:  # min/max/mean of an empty tensor
                assert leaf.device_stats[name] is None, name
                continue
            np.testing.assert_allclose(leaf.device_stats[name], value, rtol=1e-12, equal_nan=True, err_msg=name)


def test_stats_only_staging_keeps_no_bytes():
    leaves = [None, None]
    TorchAdapter()._stage_on_device(torch.device("cpu"), [torch.ones(4), torch.zeros(4)], False, [0, 1], leaves)
    for leaf in leaves:
        leaf.finish()
        assert leaf.raw is None and leaf.nbytes == 0
    assert leaves[0].device_stats["mean"] == 1.0 and leaves[1].device_stats["zero_count"] == 4
