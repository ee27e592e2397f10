"""monitor_params on CUDA: fingerprints on the device, no sync on the training thread, digests equal
to the numpy reference of the same weights. Runs where a GPU exists (skipped elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlprobe
from rlprobe.lake.grad_stats import host_fingerprints

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_monitor_params_on_cuda_does_not_synchronise_and_matches_the_reference(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 129), torch.nn.ReLU(), torch.nn.Linear(129, 7)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = [torch.randn(16, 64).cuda() for _ in range(3)]
    with rlprobe.Probe(tmp_path / "d") as probe:
        probe.monitor_params(model, optimizer=opt, name="actor")
        for i, x in enumerate(xs):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            if i > 0:  # the first step may allocate pinned memory
                torch.cuda.set_sync_debug_mode("error")
            try:
                opt.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
            probe.step()
    rows = [r for r in rlprobe.open(tmp_path / "d").arrow("param").to_pylist() if r["step"] == 2]
    rows.sort(key=lambda r: r["position"])
    want = host_fingerprints([p.detach().cpu().numpy() for p in model.parameters()])
    assert [int(r["digest"], 16) for r in rows] == [int(d) for d in want.digests]
    np.testing.assert_allclose([[r["sum"], r["norm"]] for r in rows], want.floats, rtol=1e-5, atol=1e-6)
