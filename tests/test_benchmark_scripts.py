"""The GPU benchmark script runs (on the CPU, with a tiny model) so it is ready when a GPU is lent."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_grad_gpu_overhead_script_runs_on_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import grad_gpu_overhead

    out = tmp_path / "r.json"
    assert grad_gpu_overhead.main(["--device", "cpu", "--smoke", "--tmp", str(tmp_path), "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert summary["plain_step_ms"] > 0 and summary["params"] == 2 * (64 * 128 + 128 + 128 * 64 + 64)
    for level in ("L1", "L2"):
        assert summary[level]["sign_bytes_per_step"] > summary["params"] / 8  # one bit an element plus a header
    assert "rlprobe L2" in capsys.readouterr().out
    sys.modules.pop("grad_gpu_overhead", None)


def test_transformer_shaped_workload_has_an_llm_parameter_list(monkeypatch):
    """benchmarks/grad_overhead.py --compare-layers: 12 tensors a layer, named like a decoder's."""
    import torch

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from msprobe_grad_workload import make_workload

    model, _opt, step = make_workload(0, 1e-3, torch, layers=(2, 16, 4))
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == 2 * 12 + 2 and "layers.1.qkv_proj.weight" in names and names[-1] == "norm.bias"
    before = [p.detach().clone() for p in model.parameters()]
    step(0)
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    sys.modules.pop("msprobe_grad_workload", None)
