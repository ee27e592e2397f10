"""A framework rlprobe has never heard of is one adapter file plus one registry line: tinyframe
(pure Python lists) gets key data, module dumps and gradient statistics through
tests/frameworks/tiny_adapter.py, registered here, with no other change to rlprobe."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_adapter
import tinyframe
import torch

import rlprobe
from rlprobe import frameworks
from rlprobe.errors import ProbeError
from rlprobe.frameworks.base import OptimizerStep, ParamFilter
from rlprobe.lake.grad_stats import host_batch


@pytest.fixture
def tiny():
    frameworks.register("tiny", tinyframe.__name__.split(".")[0], f"{tiny_adapter.__name__}:TinyAdapter")
    yield
    frameworks.unregister("tiny")


def _model() -> tinyframe.Module:
    return tinyframe.Module(a=tinyframe.Scale([2.0, 2.0, 2.0]), b=tinyframe.Scale([1.0, 0.0, -1.0]))


def _no_hooks(model: tinyframe.Module) -> bool:
    return all(not m.pre_hooks.live and not m.post_hooks.live for _, m in model.named_modules())


def test_key_data_of_a_registered_framework(tiny, tmp_path):
    x = tinyframe.Tensor([1.0, -2.0, 3.0, 0.5], (2, 2))
    with rlprobe.Probe(tmp_path / "d") as probe:
        probe.save({"x": x, "n": 7})
        x.values[0] = 100.0  # changed after save: the snapshot keeps the old value
    dump = rlprobe.open(tmp_path / "d")
    rows = {r["key"]: r for r in dump.arrow("key_data").to_pylist()}
    assert rows["x"]["framework"] == "tiny" and rows["n"]["framework"] == "numpy"
    assert rows["x"]["dtype"] == "float64" and rows["x"]["shape"] == [2, 2]
    assert (rows["x"]["min"], rows["x"]["max"], rows["x"]["zero_count"]) == (-2.0, 3.0, 0)
    assert rows["x"]["norm"] == pytest.approx(np.sqrt(1 + 4 + 9 + 0.25))
    np.testing.assert_array_equal(dump.tensor("x", 0), [[1.0, -2.0], [3.0, 0.5]])


def test_a_type_refused_before_its_framework_is_registered_is_taken_after(tmp_path):
    """adapter_for remembers its answer per type; registering (or removing) a framework forgets them."""
    x = tinyframe.Tensor([1.0, 2.0], (2,))
    with rlprobe.Probe(tmp_path / "d", on_error="raise") as probe:
        with pytest.raises(ProbeError, match="unsupported value of type Tensor"):
            probe.save({"x": x})
        frameworks.register("tiny", tinyframe.__name__.split(".")[0], f"{tiny_adapter.__name__}:TinyAdapter")
        try:
            probe.save({"x": x})
        finally:
            frameworks.unregister("tiny")
        with pytest.raises(ProbeError, match="unsupported value of type Tensor"):
            probe.save({"x": x})
    assert [r["framework"] for r in rlprobe.open(tmp_path / "d").arrow("key_data").to_pylist()] == ["tiny"]


def test_framework_name_accepted_once_registered(tiny, tmp_path):
    with rlprobe.Probe(tmp_path / "d", framework="tiny") as probe:
        probe.save({"x": tinyframe.Tensor([1.0])})
    assert rlprobe.open(tmp_path / "d").manifest["framework"] == "tiny"
    frameworks.unregister("tiny")
    with pytest.raises(ProbeError, match="framework='tiny': expected one of torch, mindspore, numpy"):
        rlprobe.Probe(tmp_path / "e", framework="tiny")


def test_module_dump_of_a_registered_framework(tiny, tmp_path):
    model = _model()
    with rlprobe.Probe(tmp_path / "d") as probe:
        with probe.stage("reference_compute_log_prob", model=model, tensors=True):
            model(tinyframe.Tensor([1.0, 2.0, 3.0]))
        assert _no_hooks(model)
        model(tinyframe.Tensor([5.0, 5.0, 5.0]))  # outside the block: not recorded
    dump = rlprobe.open(tmp_path / "d")
    rows = dump.arrow("module").to_pylist()
    assert {(r["module"], r["io"]) for r in rows} == {(m, io) for m in ("", "a", "b") for io in ("input", "output")}
    assert {r["framework"] for r in rows} == {"tiny"}
    seq = {r["module"]: r["seq"] for r in rows}
    assert seq["a"] < seq["b"] < seq[""]  # a module finishes before the container around it
    out = next(r for r in rows if r["module"] == "" and r["io"] == "output")
    np.testing.assert_array_equal(dump.load_tensor(out["tensor_file"], out["dtype"]), [2.0, 0.0, -6.0])
    assert (out["min"], out["max"]) == (-6.0, 2.0)


def test_gradient_monitor_of_a_registered_framework(tiny, tmp_path):
    model = _model()
    params = dict(model.parameters())
    opt = tinyframe.SGD(list(params.values()), lr=0.5)
    grads = {"a.weight": [0.5, -1.0, 0.0], "b.weight": [3.0, 4.0, -0.25]}
    with rlprobe.Probe(tmp_path / "d") as probe:
        monitor = probe.monitor_grads(model, optimizer=opt, name="policy", level="L1", params=["b.*"])
        assert monitor.framework == "tiny" and monitor.optimizer is opt
        for name, g in grads.items():
            params[name].grad = tinyframe.Tensor(g)
        opt.step()
        probe.step()
        opt.step()
    assert params["b.weight"].values == [1.0 - 3.0, 0.0 - 4.0, -1.0 + 0.25]  # stepped twice by 0.5 * grad
    assert not opt.pre_hooks.live  # close() removed the monitor's hook
    dump = rlprobe.open(tmp_path / "d")
    rows = sorted(dump.arrow("grad").to_pylist(), key=lambda r: r["step"])
    assert [(r["param"], r["step"], r["framework"]) for r in rows] == [("b.weight", 0, "tiny"), ("b.weight", 1, "tiny")]
    want = host_batch([np.array(grads["b.weight"])], "L1", [])
    assert (rows[0]["max"], rows[0]["min"], rows[0]["norm"]) == (4.0, -0.25, pytest.approx(want.stats[0, 2]))
    signs = np.load(tmp_path / "d" / rows[0]["sign_file"])
    assert np.unpackbits(signs)[:3].tolist() == [1, 1, 0]


def test_messages_name_what_the_registered_frameworks_take(tiny, tmp_path):
    with rlprobe.Probe(tmp_path / "d") as probe:
        with pytest.raises(ProbeError, match=r"module dumps take torch.nn.Module or .*tinyframe.Module models"):
            with probe.stage("actor_update", model=object()):
                pass
        with pytest.raises(ProbeError, match=r"expected a torch.nn.Module and/or .*, or a tinyframe.SGD; got"):
            probe.monitor_grads(object(), optimizer=object())
        with pytest.raises(ProbeError, match="tinyframe has no backward pass"):
            with probe.stage("actor_update", model=_model()):
                pass


@pytest.mark.parametrize("framework", ["tiny", "torch"])
def test_after_step_hook_sees_the_updated_parameters(tiny, framework):
    """The interface's after-step hook (for per-step parameter fingerprints): before_step sees the
    gradients and the parameters as they were, after_step the parameters the optimizer changed."""
    seen = []

    def snapshot(when):
        def callback(at: OptimizerStep) -> None:
            seen.append((when, [(n, _values(g)) for n, g in at.grads()] if when == "before" else [],
                         [(n, _values(p)) for n, p in at.params()]))
        return callback

    if framework == "torch":
        model = torch.nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        model.weight.grad = torch.tensor([[2.0, -2.0]])
        name = "weight"
    else:
        model = tinyframe.Module(s=tinyframe.Scale([1.0, 2.0]))
        opt = tinyframe.SGD([model.children["s"].weight], lr=0.5)
        model.children["s"].weight.grad = tinyframe.Tensor([2.0, -2.0])
        name = "s.weight"
    adapter = frameworks.adapter_for_optimizer(model, opt)
    assert adapter.name == framework
    hooks = adapter.hook_optimizer(model, opt, ParamFilter([]), "test", snapshot("before"), snapshot("after"))
    opt.step()
    hooks.remove()
    opt.step()  # no hooks: nothing more seen
    assert seen == [("before", [(name, [2.0, -2.0])], [(name, [1.0, 2.0])]),
                    ("after", [], [(name, [0.0, 3.0])])]


def _values(t) -> list[float]:
    return t.values if isinstance(t, tinyframe.Tensor) else t.detach().reshape(-1).tolist()
