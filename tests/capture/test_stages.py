"""probe.stage: module-level dumps of torch models (hooks, naming, order, step range, no leaks)."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest
import torch
from tiny_models import tiny_lm, token_ids
from torch import nn

import rlprobe
from rlprobe.capture.stages import NULL_STAGE


def rows(dump, where: str = "true") -> list[dict]:
    rel = duckdb.sql(f"SELECT * FROM read_parquet('{dump}/stats/module/**/*.parquet', hive_partitioning = true) "
                     f"WHERE {where} ORDER BY step, seq, io, \"index\"")
    cols = rel.columns
    return [dict(zip(cols, r)) for r in rel.fetchall()]


def no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
               and not m._forward_pre_hooks_with_kwargs
               for m in model.modules())


def test_forward_rows_name_every_submodule_in_completion_order(tmp_path):
    model, ids = tiny_lm(layers=2), token_ids()
    with rlprobe.Probe(tmp_path / "d") as probe:
        with probe.stage("reference_compute_log_prob", model=model):
            with torch.no_grad():
                model(ids)
    got = rows(tmp_path / "d")
    modules = {r["module"] for r in got}
    assert {"", "emb", "layers.0", "layers.0.attn", "layers.0.mlp.0", "layers.1.ln", "ln_f", "head"} <= modules
    assert {r["direction"] for r in got} == {"forward"}
    seq = {r["module"]: r["seq"] for r in got}
    # a layer finishes before the container around it; the root finishes last
    assert seq["layers.0.mlp.2"] < seq["layers.0.mlp"] < seq["layers.0"] < seq["layers.1.ln"] < seq["head"] < seq[""]
    emb_in = next(r for r in got if r["module"] == "emb" and r["io"] == "input")
    assert emb_in["dtype"] == "int64" and emb_in["index"] == "0" and emb_in["shape"] == [2, 5]
    head_out = next(r for r in got if r["module"] == "head" and r["io"] == "output")
    assert head_out["index"] == "" and head_out["shape"] == [2, 5, 11] and head_out["hash"]
    assert all(r["tensor_file"] is None for r in got)  # statistics only by default
    assert not (tmp_path / "d" / "tensors").exists()
    assert no_hooks(model)


def test_hooks_removed_on_exit_even_after_an_exception(tmp_path):
    model = tiny_lm(layers=1)
    with rlprobe.Probe(tmp_path / "d") as probe:
        with pytest.raises(RuntimeError, match="boom"):
            with probe.stage("actor_update", model=model):
                # the stage's forward hook and the backward capture's (which adds no autograd node)
                assert len(model.head._forward_hooks) == 2 and not model.head._backward_hooks
                raise RuntimeError("boom")
        assert no_hooks(model)
        with probe.stage("actor_update", model=model):
            model(token_ids()).sum().backward()
        assert no_hooks(model)
        model(token_ids()).sum().backward()  # later passes record nothing and hooks cannot fire
        probe.step()
    got = rows(tmp_path / "d")
    assert {r["call"] for r in got} == {0}  # only the pass inside the block
    assert len({r["module"] for r in got if r["direction"] == "backward"}) >= 8


def test_steps_outside_the_range_install_nothing(tmp_path):
    model = tiny_lm(layers=1)
    with rlprobe.Probe(tmp_path / "d") as probe:
        for step in range(4):
            ctx = probe.stage("actor_compute_log_prob", model=model, steps="2-3")
            if step < 2:
                assert ctx is NULL_STAGE
            with ctx:
                if step < 2:
                    assert no_hooks(model)
                with torch.no_grad():
                    model(token_ids())
            probe.step()
    assert sorted({r["step"] for r in rows(tmp_path / "d")}) == [2, 3]


def test_update_stage_records_backward_grads(tmp_path):
    model, ids = tiny_lm(layers=1), token_ids()
    with rlprobe.Probe(tmp_path / "d") as probe:
        with probe.stage("actor_update", model=model):
            model(ids).sum().backward()
    got = rows(tmp_path / "d", "direction = 'backward'")
    head = {r["io"]: r for r in got if r["module"] == "head"}
    assert head["grad_output"]["shape"] == [2, 5, 11] and head["grad_output"]["mean"] == pytest.approx(1.0)
    assert head["grad_input"]["shape"] == [2, 5, 8]
    # backward runs from the head down: the head's hook fires before the first layer's
    seq = {r["module"]: r["seq"] for r in got}
    assert seq["head"] < seq["layers.0.mlp.2"] < seq["layers.0.ln"]
    fwd_max = max(r["seq"] for r in rows(tmp_path / "d", "direction = 'forward'"))
    assert min(seq.values()) > fwd_max
    # log-prob stages default to forward only
    with rlprobe.Probe(tmp_path / "e") as probe:
        with probe.stage("actor_compute_log_prob", model=model):
            model(ids).sum().backward()
    assert {r["direction"] for r in rows(tmp_path / "e")} == {"forward"}


class Pair(nn.Module):
    def forward(self, x, scale=None, *, mask=None):
        return x * 2, {"sum": x.sum(), "none": None, "nested": (x + 1, 3)}, None


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.pair = Pair()

    def forward(self, x):
        y = self.shared(self.shared(x))
        return self.pair(y, 2.0, mask=torch.ones(3, dtype=torch.bool))


def test_tuple_dict_none_outputs_keyword_inputs_and_call_index(tmp_path):
    model = Twice()
    with rlprobe.Probe(tmp_path / "d") as probe:
        with probe.stage("critic_compute_values", model=model):
            model(torch.randn(3, 4))
            model(torch.randn(3, 4))
    got = rows(tmp_path / "d")
    pair = {(r["call"], r["io"], r["index"]) for r in got if r["module"] == "pair"}
    assert pair == {(c, io, i) for c in (0, 1) for io, i in
                    (("input", "0"), ("input", "mask"), ("output", "0"), ("output", "1.sum"), ("output", "1.nested.0"))}
    mask = next(r for r in got if r["module"] == "pair" and r["index"] == "mask")
    assert mask["dtype"] == "bool"
    calls = sorted(r["call"] for r in got if r["module"] == "shared" and r["io"] == "output")
    assert calls == [0, 1, 2, 3]  # two calls per forward, two forwards in the step
    root = sorted({r["call"] for r in got if r["module"] == ""})
    assert root == [0, 1]


def test_list_and_dict_models_are_prefixed_and_two_stages_share_a_step(tmp_path):
    actor, critic = nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 2))
    x = torch.randn(2, 4)
    with rlprobe.Probe(tmp_path / "d") as probe:
        with probe.stage("actor_compute_log_prob", model=[actor, critic]):
            critic(actor(x))
        with probe.stage("critic_compute_values", model={"critic": critic}):
            critic(x)
        probe.step()
    got = rows(tmp_path / "d")
    by_stage = {}
    for r in got:
        by_stage.setdefault(r["stage"], set()).add(r["module"])
    assert by_stage == {"actor_compute_log_prob": {"m0", "m1", "m1.0"}, "critic_compute_values": {"critic", "critic.0"}}
    first = max(r["seq"] for r in got if r["stage"] == "actor_compute_log_prob")
    assert min(r["seq"] for r in got if r["stage"] == "critic_compute_values") > first  # one sequence per step


def test_tensors_round_trip(tmp_path):
    model, ids = tiny_lm(layers=1), token_ids()
    captured = {}
    model.head.register_forward_hook(lambda m, a, out: captured.update(head=out.detach().clone()))
    with rlprobe.Probe(tmp_path / "d") as probe:
        with probe.stage("actor_update", model=model, tensors=True):
            model(ids).sum().backward()
    got = rows(tmp_path / "d")
    assert all(r["tensor_file"] for r in got)
    head = next(r for r in got if r["module"] == "head" and r["io"] == "output")
    assert head["tensor_file"] == f"tensors/module/stage=actor_update/step=0/rank=0/{head['seq']}.output._.npy"
    np.testing.assert_array_equal(np.load(tmp_path / "d" / head["tensor_file"]), captured["head"].numpy())
    emb = next(r for r in got if r["module"] == "emb" and r["io"] == "input")
    back = rlprobe.open(tmp_path / "d").load_tensor(emb["tensor_file"], emb["dtype"])
    assert back.dtype == np.int64 and np.array_equal(back, ids.numpy())


def test_bad_arguments_say_what_to_do(tmp_path):
    with rlprobe.Probe(tmp_path / "d") as probe:
        with pytest.raises(rlprobe.ProbeError, match="needs model="):
            probe.stage("actor_update")
        # the frameworks this process has imported (MindSpore only where another test loaded it)
        with pytest.raises(rlprobe.ProbeError, match=r"take torch\.nn\.Module( or mindspore\.nn\.Cell)? models"):
            with probe.stage("actor_update", model=object()):
                pass
        with pytest.raises(rlprobe.ProbeError, match="steps"):
            probe.stage("actor_update", model=nn.Linear(2, 2), steps="x-y")
        with pytest.raises(rlprobe.ProbeError, match="outside the dump"):
            probe.stage("../evil", model=nn.Linear(2, 2))


def test_mindspore_cells_forward_backward_and_graph_mode_refused(tmp_path):
    ms = pytest.importorskip("mindspore")
    from mindspore import nn as msnn

    class Net(msnn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = msnn.Dense(4, 3)
            self.act = msnn.ReLU()

        def construct(self, x):
            return self.act(self.fc(x)).sum()

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        net = Net()
        x = ms.Tensor(np.ones((2, 4), np.float32))
        with rlprobe.Probe(tmp_path / "d") as probe:
            with probe.stage("actor_update", model={"actor": net}):
                ms.value_and_grad(net, None, net.trainable_params())(x)
            assert not net._forward_hook and not net._forward_pre_hook and not net.fc._backward_hook
            ms.set_context(mode=ms.GRAPH_MODE)
            with pytest.raises(rlprobe.ProbeError, match="PyNative mode"):
                with probe.stage("actor_update", model=net):
                    pass
    finally:
        ms.set_context(mode=mode)
    got = rows(tmp_path / "d")
    assert {(r["module"], r["io"]) for r in got} >= {("actor.fc", "input"), ("actor.fc", "output"),
                                                     ("actor", "output"), ("actor.act", "grad_output")}
    assert {r["framework"] for r in got} == {"mindspore"}


def test_weights_are_fingerprinted_once_per_block_with_each_module_s_own_parameters(tmp_path):
    """capture/stage_weights.py: every hooked module's own parameters (not its children's), once per block
    (numbered in the step) with the module's next call; the digest, sum and norm are monitor_params'."""
    from rlprobe.lake.grad_stats import host_fingerprints

    model, ids = tiny_lm(layers=2), token_ids()
    with rlprobe.Probe(tmp_path / "d") as probe:
        for _ in range(2):  # one block per micro-batch, as an update stage is entered
            with probe.stage("actor_update", model={"actor": model}):
                model(ids).square().mean().backward()
        with torch.no_grad():
            model.head.bias.add_(1.0)  # an optimizer step between blocks
        with probe.stage("actor_update", model={"actor": model}):
            model(ids).square().mean().backward()
    weights = rlprobe.open(tmp_path / "d").arrow("module_param").to_pylist()
    own = {(f"actor.{m}" if m else "actor", p) for m, sub in model.named_modules()
           for p, _ in sub.named_parameters(recurse=False)}
    assert {(r["module"], r["param"]) for r in weights} == own  # own parameters only: no row for a container
    assert len(weights) == 3 * len(own) and {r["block"] for r in weights} == {0, 1, 2}
    assert {r["call"] for r in weights if r["module"] == "actor.head"} == {0, 1, 2}
    params = dict(model.named_parameters())
    for r in (r for r in weights if r["block"] == 2):
        name = r["module"].removeprefix("actor").lstrip(".") + ("." if r["module"] != "actor" else "") + r["param"]
        value = params[name].detach().numpy()
        ref = host_fingerprints([value])
        assert r["digest"] == f"{int(ref.digests[0]):016x}" and r["digest_algo"] == "mix64"
        assert r["sum"] == pytest.approx(ref.floats[0, 0], rel=1e-12, abs=1e-12)
        assert r["norm"] == pytest.approx(ref.floats[0, 1], rel=1e-12)
        assert (r["dtype"], r["shape"], r["numel"]) == ("float32", list(value.shape), value.size)
    positions = [r["position"] for r in weights if r["block"] == 0]
    assert positions == list(range(len(own)))  # the model's order
    head = {r["block"]: r["digest"] for r in weights if r["module"] == "actor.head" and r["param"] == "bias"}
    assert head[0] == head[1] != head[2]  # the step between blocks shows, the blocks of one step agree


def test_weights_false_and_stage_weights_false_record_no_weights(tmp_path):
    model, ids = tiny_lm(layers=1), token_ids()
    with rlprobe.Probe(tmp_path / "plain") as probe:
        with probe.stage("reference_compute_log_prob", model=model, weights=False), torch.no_grad():
            model(ids)
    configured = rlprobe.from_config({"rlprobe_config": {"dump_path": str(tmp_path / "cfg"), "stage_weights": False,
                                                         "stages": ["reference_compute_log_prob"]}})
    with configured.stage("reference_compute_log_prob", model=model), torch.no_grad():
        model(ids)
    configured.close()
    for name in ("plain", "cfg"):
        dump = rlprobe.open(tmp_path / name)
        assert dump.arrow("module").num_rows > 0 and dump.arrow("module_param").num_rows == 0
    with pytest.raises(rlprobe.ProbeError, match="stage_weights"):
        rlprobe.from_config({"rlprobe_config": {"stage_weights": "yes", "stages": ["actor_update"]}})


@pytest.mark.parametrize("on_error", ["raise", "warn"])
def test_weights_it_cannot_fingerprint_are_an_error_naming_the_parameter(tmp_path, on_error):
    model = nn.Sequential(nn.Linear(2, 2))
    model[0].register_parameter("phase", nn.Parameter(torch.zeros(2, dtype=torch.complex64)))
    with rlprobe.Probe(tmp_path / "d", on_error=on_error) as probe:
        if on_error == "raise":
            with pytest.raises(rlprobe.ProbeError, match=r"stage 'actor_update': cannot fingerprint the weights "
                                                         r"\(module '0', parameter 'phase'\).*weights=False"):
                probe.stage("actor_update", model=model).__enter__()
            assert no_hooks(model)  # nothing left installed
        else:
            with pytest.warns(RuntimeWarning, match="cannot fingerprint the weights"):
                with probe.stage("actor_update", model=model):
                    model(torch.ones(1, 2)).sum().backward()
    if on_error == "warn":  # the module rows are written, the weights are not
        dump = rlprobe.open(tmp_path / "d")
        assert dump.arrow("module").num_rows > 0 and dump.arrow("module_param").num_rows == 0
