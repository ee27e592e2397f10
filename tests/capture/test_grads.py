"""probe.monitor_grads on torch (CPU): stats, sign bits, digest, step counting, hooks, config."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import rlprobe
from rlprobe.lake.grad_stats import host_batch, mix64_numpy
from rlprobe.errors import ProbeError
from rlprobe.frameworks.torch_grads import launch, mix64
from torch.optim.optimizer import _global_optimizer_pre_hooks as _GLOBAL_PRE_HOOKS


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 13), torch.nn.ReLU(), torch.nn.Linear(13, 3))


def _train(model, opt, steps: int, probe=None, record=None, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(6, 8, generator=g)).pow(2).sum().backward()
        if record is not None:
            record.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        opt.step()
        if probe is not None:
            probe.step()


def _rows(path: Path, monitor: str | None = None) -> list[dict]:
    rows = rlprobe.open(path).arrow("grad").to_pylist()
    return sorted((r for r in rows if monitor is None or r["monitor"] == monitor), key=lambda r: (r["step"], r["param"]))


def _signs(path: Path, row: dict) -> np.ndarray:
    data = np.load(path / row["sign_file"])
    return data[row["sign_offset"]: row["sign_offset"] + (row["sign_numel"] + 7) // 8]


def test_l2_stats_signs_and_buckets_match_numpy(tmp_path: Path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bounds = [-0.1, 0.0, 0.1]
    with rlprobe.Probe(tmp_path / "d") as probe:
        probe.monitor_grads(model, optimizer=opt, name="actor", level="L2", bounds=bounds)
        record: list = []
        _train(model, opt, 3, probe, record)
    rows = _rows(tmp_path / "d")
    assert len(rows) == 3 * 4
    for r in rows:
        g = record[r["step"]][r["param"]].numpy().reshape(-1)
        assert r["probe_step"] == r["step"] and r["level"] == "L2" and r["dtype"] == "float32"
        assert r["shape"] == list(record[0][r["param"]].shape) and r["numel"] == g.size
        assert r["max"] == float(g.max()) and r["min"] == float(g.min())
        assert r["norm"] == pytest.approx(float(np.linalg.norm(g.astype(np.float64))), rel=1e-6)
        edges = [-np.inf, *bounds, np.inf]
        expected = [np.count_nonzero((g > lo) & (g <= hi)) / g.size for lo, hi in zip(edges, edges[1:])]
        assert r["bucket_fractions"] == pytest.approx(expected, abs=0) and r["bounds"] == bounds
        assert r["zero_fraction"] == np.count_nonzero(g == 0) / g.size
        assert np.array_equal(_signs(tmp_path / "d", r), np.packbits(g > 0)), r["param"]
        assert r["sign_file"] == f"tensors/grad_sign/monitor=actor/step={r['step']}/rank=0/signs.npy"
    # one file per step, the parameters byte-aligned one after another
    step0 = [r for r in rows if r["step"] == 0]
    total = sum((r["numel"] + 7) // 8 for r in step0)
    assert np.load(tmp_path / "d" / step0[0]["sign_file"]).nbytes == total


def test_l0_digest_is_mix64_of_the_raw_bytes_and_l1_has_no_buckets(tmp_path: Path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with rlprobe.Probe(tmp_path / "d") as probe:
        probe.monitor_grads(model, optimizer=opt, name="l0", level="L0")
        probe.monitor_grads(model, optimizer=opt, name="l1", level="L1")
        record: list = []
        _train(model, opt, 2, probe, record)
    for r in _rows(tmp_path / "d", "l0"):
        assert r["digest_algo"] == "mix64" and r["sign_file"] is None and r["bucket_fractions"] is None
        assert int(r["digest"], 16) == mix64_numpy(record[r["step"]][r["param"]].numpy())
    l1 = _rows(tmp_path / "d", "l1")
    assert l1 and all(r["digest"] is None and r["bucket_fractions"] is None and r["sign_file"] for r in l1)


def test_device_kernel_equals_numpy_kernel_for_odd_sizes_and_bf16():
    torch.manual_seed(3)
    grads = [torch.randn(5, 3), torch.zeros(7), torch.randn(1), torch.randn(9).to(torch.bfloat16), torch.empty(0)]
    for level in ("L0", "L2"):
        finish, _ = launch(grads, level, [-0.5, 0.0, 0.5])
        got = finish()
        want = host_batch([g.float().numpy() if g.dtype == torch.bfloat16 else g.numpy() for g in grads],
                          level, [-0.5, 0.0, 0.5])
        np.testing.assert_allclose(got.stats, want.stats, rtol=1e-6, equal_nan=True)
        if level == "L2":
            assert np.array_equal(got.signs, want.signs) and got.sign_offsets == want.sign_offsets
    bf = grads[3]
    assert int(mix64(bf.reshape(-1))) & (2**64 - 1) == mix64_numpy(bf.view(torch.int16).numpy())


def test_step_counts_per_optimizer_with_two_optimizers_and_skipped_steps(tmp_path: Path):
    actor, critic = _model(0), _model(1)
    opt_a = torch.optim.AdamW(actor.parameters(), lr=1e-3)
    opt_c = torch.optim.SGD(critic.parameters(), lr=1e-2)
    with rlprobe.Probe(tmp_path / "d") as probe:
        probe.monitor_grads(actor, name="actor", level="L1")  # found via the global hook
        probe.monitor_grads(critic, optimizer=opt_c, name="critic", level="L1")
        g = torch.Generator().manual_seed(0)
        for it in range(4):
            for model, opt in ((actor, opt_a), (critic, opt_c), (critic, opt_c)):  # critic steps twice
                opt.zero_grad()
                model(torch.randn(2, 8, generator=g)).sum().backward()
                if not (model is actor and it == 1):  # as a GradScaler does on inf grads: no step() call
                    opt.step()
            probe.step()
    actor_rows = _rows(tmp_path / "d", "actor")
    assert sorted({r["step"] for r in actor_rows}) == [0, 1, 2]
    assert {r["step"]: r["probe_step"] for r in actor_rows} == {0: 0, 1: 2, 2: 3}
    assert sorted({r["step"] for r in _rows(tmp_path / "d", "critic")}) == list(range(8))


def test_grad_scaler_skip_is_not_counted(tmp_path: Path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    with rlprobe.Probe(tmp_path / "d") as probe:
        mon = probe.monitor_grads(model, optimizer=opt, level="L1")
        for bad in (False, True, False):
            opt.zero_grad()
            loss = model(torch.randn(2, 8)).sum() * (float("inf") if bad else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            probe.step()
        assert mon.count == 2
    assert sorted({r["probe_step"] for r in _rows(tmp_path / "d")}) == [0, 2]


def test_selection_frozen_missing_grad_and_main_grad(tmp_path: Path):
    model = _model()
    model[0].bias.requires_grad_(False)  # frozen: never monitored
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with rlprobe.Probe(tmp_path / "d") as probe:
        probe.monitor_grads(model, optimizer=opt, params=["*.weight", "2.bias"], steps=[0, "2-3"], level="L1")
        for step in range(4):
            opt.zero_grad(set_to_none=True)
            model(torch.randn(2, 8)).sum().backward()
            if step == 2:
                model[2].bias.grad = None  # no gradient this step: no row
            if step == 3:
                model[0].weight.main_grad = torch.full_like(model[0].weight, -1.0)  # Megatron-style
            opt.step()
            probe.step()
    rows = _rows(tmp_path / "d")
    assert {(r["step"], r["param"]) for r in rows} == {
        (0, "0.weight"), (0, "2.weight"), (0, "2.bias"), (2, "0.weight"), (2, "2.weight"),
        (3, "0.weight"), (3, "2.weight"), (3, "2.bias")}
    main = next(r for r in rows if r["step"] == 3 and r["param"] == "0.weight")
    assert main["max"] == -1.0 and not _signs(tmp_path / "d", main).any()


def test_hooks_removed_on_close_and_by_handle(tmp_path: Path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = rlprobe.Probe(tmp_path / "d")
    mon = probe.monitor_grads(model, optimizer=opt)
    found = probe.monitor_grads(model, name="found")
    other = probe.monitor_grads(model, optimizer=opt, name="other")
    other.remove()
    before_global = len(_GLOBAL_PRE_HOOKS)
    assert len(opt._optimizer_step_pre_hooks) == 1  # "found" waits on the global hook
    _train(model, opt, 1, probe)
    assert len(_GLOBAL_PRE_HOOKS) == before_global - 1  # found: per-opt now
    assert len(opt._optimizer_step_pre_hooks) == 2
    probe.close()
    assert len(opt._optimizer_step_pre_hooks) == 0 and mon.count == 1 and found.count == 1
    _train(model, opt, 1)  # no error, no counting after close
    assert mon.count == 1
    assert {r["monitor"] for r in _rows(tmp_path / "d")} == {"default", "found"}


def test_bad_arguments_say_what_to_do(tmp_path: Path):
    model = _model()
    with rlprobe.Probe(tmp_path / "d") as probe:
        with pytest.raises(ProbeError, match="level"):
            probe.monitor_grads(model, level="L3")
        with pytest.raises(ProbeError, match="increasing"):
            probe.monitor_grads(model, bounds=[1, 0])
        with pytest.raises(ProbeError, match="give a model"):
            probe.monitor_grads()
        with pytest.raises(ProbeError, match="no trainable parameter"):
            probe.monitor_grads(model, params=["nothing*"])


def test_msprobe_style_config(tmp_path: Path):
    from rlprobe.compat.msprobe import PrecisionDebugger

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "grad_probe", "dump_path": str(tmp_path / "d"), "rank": [], "step": [1],
                                  "grad_probe": {"grad_level": "L2", "param_list": ["0.weight"], "bounds": [-1, 0, 1]}}))
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger = PrecisionDebugger(str(config))
    debugger.monitor(model)
    _train(model, opt, 3)
    debugger.stop()
    rows = _rows(tmp_path / "d")
    assert [(r["step"], r["param"], r["level"]) for r in rows] == [(1, "0.weight", "L2")]
    assert rows[0]["bounds"] == [-1.0, 0.0, 1.0]


def test_device_path_on_cpu_tensors_equals_the_host_kernel():
    """The accelerator path's arithmetic (torch ops, bit packing, payload layout) checked without
    an accelerator: run on CPU tensors it must equal the numpy kernel exactly where exact."""
    from rlprobe.frameworks.torch_grads import _launch_device

    g = torch.Generator().manual_seed(7)
    grads = [torch.randn(257, 33, generator=g), torch.zeros(7), torch.randn(1, generator=g), torch.empty(0),
             torch.randn(9, generator=g).to(torch.bfloat16), torch.randn(4096, generator=g).double()]
    grads[0][0, 0], grads[0][1, 1], grads[0][2, 2] = -0.0, 0.1, -0.1  # on a bound
    grads[2][0] = float("nan")
    for level in ("L0", "L1", "L2"):
        got = _launch_device([t.reshape(-1) for t in grads], level, [-0.1, 0.0, 0.1], torch.device("cpu"))[0]()
        want = host_batch([t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy() for t in grads],
                          level, [-0.1, 0.0, 0.1])
        np.testing.assert_allclose(got.stats, want.stats, rtol=1e-6, equal_nan=True)
        counts = slice(3, None)  # zero and bound counts: exact
        np.testing.assert_array_equal(got.stats[:, counts], want.stats[:, counts])
        if level == "L0":
            keep = [0, 1, 2, 3, 5]  # bf16 digests are of its own bytes (the reference saw float32)
            assert np.array_equal(got.digests[keep], want.digests[keep])
        else:
            assert np.array_equal(got.signs, want.signs) and got.sign_offsets == want.sign_offsets
