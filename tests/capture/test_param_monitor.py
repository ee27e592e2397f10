"""probe.monitor_params(): fingerprints of the weights after each optimizer step (rlprobe/capture/params.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlprobe
from rlprobe.errors import ProbeError
from rlprobe.frameworks import torch_grads
from rlprobe.lake.grad_stats import host_fingerprints


def _train(path, *, steps=3, lr=0.1, config=None, grads=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    probe = rlprobe.from_config(config) if config is not None else rlprobe.Probe(path)
    with probe:
        if grads:
            probe.monitor_grads(model, optimizer=opt, name="actor")
        probe.monitor_params(model, optimizer=opt, name="actor")
        g = torch.Generator().manual_seed(1)
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(4, 8, generator=g)).pow(2).mean().backward()
            opt.step()
            probe.step()
    return model


def test_rows_hold_the_fingerprint_of_the_weights_after_each_step(tmp_path):
    model = _train(tmp_path / "d")
    rows = rlprobe.open(tmp_path / "d").arrow("param").to_pylist()
    assert sorted({(r["step"], r["probe_step"]) for r in rows}) == [(0, 0), (1, 1), (2, 2)]
    last = sorted((r for r in rows if r["step"] == 2), key=lambda r: r["position"])
    names = [n for n, _ in model.named_parameters()]
    assert [r["param"] for r in last] == names and [r["position"] for r in last] == list(range(4))
    want = host_fingerprints([p.detach().numpy() for p in model.parameters()])
    assert [int(r["digest"], 16) for r in last] == [int(d) for d in want.digests]
    for r, (s, norm) in zip(last, want.floats):
        assert r["sum"] == pytest.approx(s, rel=1e-6, abs=1e-9) and r["norm"] == pytest.approx(norm, rel=1e-9)
        assert r["digest_algo"] == "mix64" and r["framework"] == "torch" and r["dtype"] == "float32"
    # every step's weights changed, so every digest differs from the step before
    by_step = {s: {r["param"]: r["digest"] for r in rows if r["step"] == s} for s in range(3)}
    assert all(by_step[s][n] != by_step[s + 1][n] for s in range(2) for n in names)


def test_two_identical_runs_have_equal_fingerprints_and_another_lr_does_not(tmp_path):
    _train(tmp_path / "a")
    _train(tmp_path / "b")
    _train(tmp_path / "c", lr=0.2)
    digests = {k: sorted((r["step"], r["param"], r["digest"]) for r in rlprobe.open(tmp_path / k).arrow("param")
                         .to_pylist()) for k in "abc"}
    assert digests["a"] == digests["b"]
    assert all(x[2] != y[2] for x, y in zip(digests["a"], digests["c"]))


def test_cpu_fingerprints_read_their_step_s_weights_though_the_next_step_follows_at_once(tmp_path):
    """On the CPU the fingerprints are computed in a thread beside the training (torch_grads.
    CpuFingerprints); the next optimizer step waits for it, so no row holds half-updated weights."""
    w = torch.nn.Parameter(torch.randn(4_000_000, generator=torch.Generator().manual_seed(0)))
    opt = torch.optim.SGD([w], lr=0.1)
    after = []
    with rlprobe.Probe(tmp_path / "d") as probe:
        probe.monitor_params(optimizer=opt, name="big")
        for _ in range(4):
            w.grad = torch.ones_like(w)
            opt.step()  # the fingerprint thread starts here...
            opt.step()  # ...and this step, which changes every weight again, waits for it
            after.append(w.detach().clone().numpy())
            probe.step()
    rows = sorted(rlprobe.open(tmp_path / "d").arrow("param").to_pylist(), key=lambda r: r["step"])
    assert [r["step"] for r in rows] == list(range(8))
    for r in rows[1::2]:  # the second step of each pair: the weights saved just after it
        want = host_fingerprints([after[r["step"] // 2]])
        assert int(r["digest"], 16) == int(want.digests[0]), r["step"]
    assert len({r["digest"] for r in rows}) == 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_cpu_kernel_and_device_path_equal_the_numpy_reference(dtype):
    g = torch.Generator().manual_seed(3)
    tensors = [torch.randn(37, 11, generator=g).to(dtype), torch.randn(5, generator=g).to(dtype),
               torch.empty(0, 3, dtype=dtype), torch.randn(10007, generator=g).to(dtype)]
    narrow = dtype in (torch.bfloat16, torch.float16)
    raw = [t.view(torch.int16).numpy() if narrow else t.numpy() for t in tensors]
    want = host_fingerprints([t.float().numpy() if narrow else t.numpy() for t in tensors], raw)
    for path in (torch_grads._cpu, lambda f: torch_grads._device(f, torch.device("cpu"))):
        got = path([t.reshape(-1) for t in tensors])[0]()
        assert np.array_equal(got.digests, want.digests)
        np.testing.assert_allclose(got.floats, want.floats, rtol=1e-6, atol=1e-9)


def test_device_path_never_reads_a_value_back_on_the_training_thread(monkeypatch):
    """The accelerator path queues device work only: no .item(), .cpu(), .tolist() or .numpy() until
    finish(), which the writer thread calls (run here on CPU tensors; tests/capture/test_param_monitor_cuda
    checks the same on a GPU with torch's sync debug mode)."""
    tensors = [torch.randn(64, 32), torch.randn(32)]
    calls = []
    for name in ("item", "cpu", "tolist", "numpy"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _n=name, _o=original, **k: calls.append(_n)
                            or _o(self, *a, **k))
    finish, nbytes = torch_grads._device([t.reshape(-1) for t in tensors], torch.device("cpu"))
    assert calls == [] and nbytes == 2 * 24
    monkeypatch.undo()
    batch = finish()
    assert np.array_equal(batch.digests, host_fingerprints([t.numpy() for t in tensors]).digests)


def test_the_switch_off_records_no_rows_and_on_records_them_without_the_gradient_monitor(tmp_path):
    on = {"rlprobe_config": {"dump_path": str(tmp_path / "on"), "param_fingerprints": True}}
    off = {"rlprobe_config": {"dump_path": str(tmp_path / "off"), "param_fingerprints": False, "key_data_dump": True}}
    _train(None, config=on)
    _train(None, config=off)
    assert rlprobe.open(tmp_path / "on").arrow("param").num_rows == 3 * 4
    assert rlprobe.open(tmp_path / "on").arrow("grad").num_rows == 0
    assert rlprobe.open(tmp_path / "off").arrow("param").num_rows == 0
    _train(None, config={"rlprobe_config": {"dump_path": str(tmp_path / "none"), "param_fingerprints": False}})
    assert not (tmp_path / "none").exists()  # nothing switched on: no probe, no files


def test_bad_arguments_name_the_monitor_and_what_was_expected(tmp_path):
    with rlprobe.Probe(tmp_path / "d") as probe:
        with pytest.raises(ProbeError, match=r"monitor_params\(name='x'\): give a model, an optimizer or both"):
            probe.monitor_params(name="x")
        with pytest.raises(ProbeError, match=r"monitor_params\(name='a/b'\): name must be a plain"):
            probe.monitor_params(torch.nn.Linear(2, 2), name="a/b")
        with pytest.raises(ProbeError, match=r"no trainable parameter matches params=\['nope\*'\]"):
            probe.monitor_params(torch.nn.Linear(2, 2), name="x", params=["nope*"])


def test_mindspore_optimizer_fingerprints_match_the_numpy_reference(tmp_path):
    ms = pytest.importorskip("mindspore")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = ms.nn.Dense(4, 3)
    opt = ms.nn.SGD(net.trainable_params(), learning_rate=0.1)
    step = ms.nn.TrainOneStepCell(ms.nn.WithLossCell(net, ms.nn.MSELoss()), opt)
    x = ms.Tensor(np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32))
    y = ms.Tensor(np.zeros((2, 3), np.float32))
    with rlprobe.Probe(tmp_path / "ms") as probe:
        probe.monitor_params(optimizer=opt, name="actor")
        for _ in range(2):
            step(x, y)
            probe.step()
    rows = sorted(rlprobe.open(tmp_path / "ms").arrow("param").to_pylist(), key=lambda r: (r["step"], r["position"]))
    assert [(r["step"], r["framework"]) for r in rows] == [(0, "mindspore")] * 2 + [(1, "mindspore")] * 2
    want = host_fingerprints([p.asnumpy() for p in opt.parameters])
    assert [int(r["digest"], 16) for r in rows[2:]] == [int(d) for d in want.digests]
    assert rows[0]["digest"] != rows[2]["digest"]


def test_a_fingerprint_batch_that_fails_is_an_error_naming_it_and_loses_nothing_else(tmp_path):
    """The writer's job of monitor_params and of a stage's weights (capture/params.submit_rows): a batch whose
    read fails (a device lost, say) is recorded in rank0.json and warned of, and the step's other rows stay."""
    import json
    import warnings

    from rlprobe.capture.params import submit_rows

    def lost() -> None:
        raise RuntimeError("device lost")

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with rlprobe.Probe(tmp_path / "d", on_error="warn") as probe:
            probe.save({"loss": 1.0})
            submit_rows(probe.writer, "module_param", "stage 'actor_update' step 0: fingerprints of the weights failed",
                        lost, lambda batch: [], 0, {"stage": "actor_update", "step": 0})
            probe.step()
    message = "stage 'actor_update' step 0: fingerprints of the weights failed: RuntimeError: device lost"
    assert any(message in str(w.message) for w in seen)
    assert json.loads((tmp_path / "d" / "rank0.json").read_text())["errors"] == [message]
    assert rlprobe.open(tmp_path / "d").key_data().collect()["key"].to_list() == ["loss"]
