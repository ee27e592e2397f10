"""probe.monitor_grads(optimizer=opt) for a MindSpore optimizer (CPU, pynative)."""

from __future__ import annotations

from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

import rlprobe
from rlprobe.lake.grad_stats import mix64_numpy
from rlprobe.errors import ProbeError


@pytest.fixture(autouse=True)
def _pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE)


def _setup(seed: int = 0):
    ms.set_seed(seed)
    net = nn.SequentialCell([nn.Dense(4, 5), nn.ReLU(), nn.Dense(5, 3)])
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    loss_fn = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    return net, opt, grad_fn


def test_l2_rows_and_sign_bits_match_numpy(tmp_path: Path):
    net, opt, grad_fn = _setup()
    rng = np.random.default_rng(0)
    record = []
    with rlprobe.Probe(tmp_path / "d") as probe:
        probe.monitor_grads(optimizer=opt, name="policy", level="L2", bounds=[-0.1, 0, 0.1])
        for _ in range(3):
            x = ms.Tensor(rng.standard_normal((6, 4)).astype(np.float32))
            y = ms.Tensor(rng.standard_normal((6, 3)).astype(np.float32))
            _, grads = grad_fn(x, y)
            record.append({p.name: g.asnumpy() for p, g in zip(opt.parameters, grads)})
            opt(grads)
            probe.step()
        skipped_grads = grads  # a loss-scale overflow skips opt(...): nothing counted
        probe.step()
        opt(skipped_grads)
        probe.step()
    rows = sorted(rlprobe.open(tmp_path / "d").arrow("grad").to_pylist(), key=lambda r: (r["step"], r["param"]))
    names = sorted(p.name for p in opt.parameters)
    assert [(r["step"], r["param"]) for r in rows] == [(s, n) for s in range(4) for n in names]
    assert [r["probe_step"] for r in rows if r["param"] == names[0]] == [0, 1, 2, 4]
    record.append({p.name: g.asnumpy() for p, g in zip(opt.parameters, skipped_grads)})
    for r in rows:
        g = record[r["step"]][r["param"]].reshape(-1)
        assert r["framework"] == "mindspore" and r["dtype"] == "float32"
        assert r["max"] == float(g.max()) and r["min"] == float(g.min())
        assert r["norm"] == pytest.approx(float(np.linalg.norm(g)), rel=1e-6)
        assert r["zero_fraction"] == np.count_nonzero(g == 0) / g.size
        signs = np.load(tmp_path / "d" / r["sign_file"])
        assert np.array_equal(signs[r["sign_offset"]: r["sign_offset"] + (g.size + 7) // 8], np.packbits(g > 0))


def test_l0_digest_and_param_selection(tmp_path: Path):
    net, opt, grad_fn = _setup()
    weight = [p.name for p in opt.parameters if p.name.endswith("weight")]
    with rlprobe.Probe(tmp_path / "d") as probe:
        handle = probe.monitor_grads(optimizer=opt, level="L0", params=["*weight"])
        x, y = ms.Tensor(np.ones((2, 4), np.float32)), ms.Tensor(np.zeros((2, 3), np.float32))
        _, grads = grad_fn(x, y)
        opt(grads)
        probe.step()
        handle.remove()
        opt(grads)  # removed: not recorded
    rows = rlprobe.open(tmp_path / "d").arrow("grad").to_pylist()
    assert sorted(r["param"] for r in rows) == sorted(weight)
    by_name = {p.name: g.asnumpy() for p, g in zip(opt.parameters, grads)}
    for r in rows:
        assert r["digest_algo"] == "mix64" and int(r["digest"], 16) == mix64_numpy(by_name[r["param"]])


def test_graph_mode_is_refused_with_advice(tmp_path: Path):
    _, opt, _ = _setup()
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with rlprobe.Probe(tmp_path / "d") as probe:
            with pytest.raises(ProbeError, match="PYNATIVE_MODE"):
                probe.monitor_grads(optimizer=opt)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
