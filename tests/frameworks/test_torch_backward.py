"""Backward capture of torch modules (frameworks/torch_backward.py): the gradients torch's full
backward hooks report, in the same order, without a single autograd node added to the graph."""

from __future__ import annotations

import warnings

import duckdb
import torch
from torch import nn

import rlprobe
from rlprobe.frameworks.torch_backward import ModuleBackward


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc, self.act = nn.LayerNorm(8), nn.Linear(8, 8), nn.GELU()

    def forward(self, x, scale=None):
        h = self.act(self.fc(self.ln(x)))
        return x + h * h, h.sum()  # a residual (x used twice) and a second output nobody uses


class TiedLM(nn.Module):
    """Embedding weights reused by the head, a layer called twice: tensors whose gradients are sums."""

    def __init__(self):
        super().__init__()
        self.emb, self.shared = nn.Embedding(11, 8), nn.Linear(8, 8)
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, ids):
        x = self.shared(self.shared(self.emb(ids)))
        for b in self.blocks:
            x, _ = b(x, scale=2.0)
        return (x + x) @ self.emb.weight.T


def ids() -> torch.Tensor:
    return torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])


def backward_calls(hook_with) -> list[tuple[str, list, list]]:
    torch.manual_seed(0)
    model, seen, handles = TiedLM(), [], []
    for name, module in model.named_modules():
        def record(mod, grad_input, grad_output, name=name):
            seen.append((name, [g if g is None else g.clone() for g in grad_output],
                         [g if g is None else g.clone() for g in grad_input]))
        handles.append(hook_with(module, record))
    model(ids()).log_softmax(-1).sum().backward()
    for h in handles:
        h.remove()
    return seen


def test_same_calls_order_and_gradients_as_full_backward_hooks():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns for the embedding, whose input needs no gradient
        theirs = backward_calls(lambda m, f: m.register_full_backward_hook(f))
    ours = backward_calls(ModuleBackward)
    assert [c[0] for c in ours] == [c[0] for c in theirs]
    assert [c[0] for c in ours].count("shared") == 2
    for (name, out_a, in_a), (_, out_b, in_b) in zip(ours, theirs):
        assert len(out_a) == len(out_b) and len(in_a) == len(in_b), name
        for a, b in zip(out_a + in_a, out_b + in_b):
            assert (a is None) == (b is None), name
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)
    blocks = {name: (out, gin) for name, out, gin in ours if name.startswith("blocks.")}
    out, gin = blocks["blocks.0"]
    assert out[1] is None and len(gin) == 1 and gin[0].shape == (2, 4, 8)  # unused output, kwargs not counted
    assert [g for g in dict((c[0], c[2]) for c in ours)["emb"]] == [None]  # token ids need no gradient


def train_step(stage: bool, dump) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = TiedLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with rlprobe.Probe(dump) as probe:
        for _ in range(2):
            with probe.stage("actor_update", model=model) if stage else torch.enable_grad():
                model(ids()).log_softmax(-1).sum().backward()
            opt.step()
            opt.zero_grad()
            probe.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_an_update_stage_leaves_training_bit_for_bit_unchanged(tmp_path):
    with_stage, without = train_step(True, tmp_path / "a"), train_step(False, tmp_path / "b")
    assert all(torch.equal(with_stage[n], without[n]) for n in without)
    rows = duckdb.sql(f"SELECT module, io FROM read_parquet('{tmp_path}/a/stats/module/**/*.parquet') "
                      "WHERE direction = 'backward' AND step = 1").fetchall()
    assert ("blocks.1.fc", "grad_input") in rows and ("emb", "grad_output") in rows


def test_a_backward_after_the_stage_records_nothing_and_keeps_no_hooks(tmp_path):
    torch.manual_seed(0)
    model = TiedLM()
    with rlprobe.Probe(tmp_path / "d") as probe:
        with probe.stage("actor_update", model=model):
            loss = model(ids()).sum()
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
        loss.backward()
    got = duckdb.sql(f"SELECT DISTINCT direction FROM read_parquet('{tmp_path}/d/stats/module/**/*.parquet')")
    assert got.fetchall() == [("forward",)]
