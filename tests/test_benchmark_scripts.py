"""The GPU benchmark script runs (on the CPU, with a tiny model) so it is ready when a GPU is lent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_decoder_workload_runs_on_cpu(tmp_path, monkeypatch, capsys):
    """grad_gpu_overhead.py --workload decoder: the Llama-shaped decoder's smoke size, end to end."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import grad_gpu_overhead

    out = tmp_path / "r.json"
    assert grad_gpu_overhead.main(["--workload", "decoder", "--device", "cpu", "--smoke", "--tmp", str(tmp_path),
                                   "--levels", "L1,L2,L2@0", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    # 2 layers of 9 tensors (2 norms, q/k/v/o, gate/up/down) + embedding, final norm, LM head
    dim, ffn, vocab = 64, 128, 256
    per_layer = 4 * dim * dim + 3 * dim * ffn + 2 * dim
    assert summary["tensors"] == 21 and summary["params"] == 2 * per_layer + 2 * vocab * dim + dim
    for level, goal in (("L1", 2), ("L2", 3), ("L2@0", 3)):  # L2@0: level L2 with flush_interval=0
        assert summary[level]["goal_pct"] == goal and summary[level]["kernel"] == "compiled (CPU)"
        assert summary[level]["sign_bytes_per_step"] > summary["params"] / 8
    assert "Llama-architecture decoder" in capsys.readouterr().out
    sys.modules.pop("grad_gpu_overhead", None)


def test_decoder_workload_is_the_issues_953m_parameters_in_147_tensors(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import grad_gpu_overhead

    model = grad_gpu_overhead.make_decoder(grad_gpu_overhead.DECODER, "meta")  # shapes only, no memory
    named = dict(model.named_parameters())
    assert len(named) == 147 and sum(p.numel() for p in named.values()) == 953_223_168
    assert named["layers.15.gate_proj.weight"].shape == (5632, 2048) and named["lm_head.weight"].shape == (32000, 2048)
    sys.modules.pop("grad_gpu_overhead", None)


def test_triton_kernel_sweep_script_runs_under_the_interpreter(tmp_path):
    """grad_kernel_sweep.py's whole path (shapes, copy bandwidth, agreement, launches, torch-ops
    comparison) on tiny shapes, in a process started with TRITON_INTERPRET=1."""
    out = tmp_path / "sweep.json"
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(BENCHMARKS.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "grad_kernel_sweep.py"), "--device", "cpu", "--smoke",
                           "--workloads", "decoder", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    w = json.loads(out.read_text())["workloads"]["decoder"]
    assert w["tensors"] == 12 and w["gradient_bytes"] == 4 * w["elements"]
    assert [(s["block"], s["warps"]) for s in w["shapes"]] == [(16, 1), (32, 1)]
    assert all(s["agrees"] for s in w["shapes"]) and w["best"]["block"] in (16, 32)
    for key in ("L2_kernels_ms", "L1_kernels_ms", "triton L2 launch+copy ms", "torch ops L2 launch+copy ms",
                "triton L2 issue ms (host)", "torch ops L2 issue ms (host)"):
        assert w["shipped"][key] > 0, key
    assert "of copy" in proc.stdout


def test_gpu_checks_script_parses():
    assert subprocess.run(["bash", "-n", str(BENCHMARKS / "gpu_checks.sh")]).returncode == 0


def test_cold_save_run_of_the_save_benchmark(tmp_path):
    """save_overhead.py --cold runs each tool in a fresh process; rlprobe's run, end to end."""
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(BENCHMARKS.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "save_overhead.py"), "--cold-child", "--dump",
                           str(tmp_path / "d")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["tool"] == "rlprobe" and got["save_blocking_s"] > 0 and got["init_s"] > 0
    assert got["bytes_on_disk"] > 8 * 6 * 64 * 4096 * 4  # every float32 tensor of the 8 calls is on disk


def test_check_speed_script_runs(tmp_path, monkeypatch, capsys):
    """benchmarks/check_speed.py --smoke: both phases run and the planted NaN is named."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import check_speed

    out = tmp_path / "r.json"
    assert check_speed.main(["--smoke", "--cache", str(tmp_path / "cache"), "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    nan = figures["nonfinite"]
    assert nan["status"] == "fail" and "name=advantages, step=2, rank=1, micro_step=1" in nan["first"]
    assert figures["sql_s"] > 0 and figures["token_s"] > 0
    assert "token phase" in capsys.readouterr().out
    sys.modules.pop("check_speed", None)


def test_interleaved_fingerprint_ratios_pair_each_fingerprinted_step_with_its_neighbours(tmp_path, monkeypatch):
    """benchmarks/grad_overhead.py --params: every other step fingerprinted, one ratio per such step."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import grad_overhead
    import rlprobe

    ratios = grad_overhead.run_params_interleaved(tmp_path / "d", steps=5, warmup=1)
    assert len(ratios) == 2 and all(r > 0 for r in ratios)  # steps 2 and 4, between plain steps 1, 3 and 5
    rows = rlprobe.open(tmp_path / "d").arrow("param").to_pylist()
    assert sorted({r["step"] for r in rows}) == [0, 2, 4]  # the even optimizer steps only
    sys.modules.pop("grad_overhead", None)
    sys.modules.pop("msprobe_grad_workload", None)


def test_compare_timeline_script_prints_each_run_s_phases(tmp_path):
    """benchmarks/compare_timeline.py: a fresh process a run, its spans, and a line of phases each."""
    import numpy as np

    runs = []
    for name, value in (("a", 1.0), ("b", 2.0)):
        folder = tmp_path / name / "data" / "x" / "step0" / "rank0" / "micro_step0"
        folder.mkdir(parents=True)
        np.save(folder / "x.npy", np.full(4, value, np.float32))
        runs.append(str(tmp_path / name))
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_timeline.py"
    done = subprocess.run([sys.executable, str(script), *runs, "--workers", "1,2", "--json", str(tmp_path / "t.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    phases = [line for line in done.stdout.splitlines() if "before pairs" in line]
    assert [line.split(" worker")[0] for line in phases] == ["1", "2"]
    assert all("2 cores:" in line and "output" in line for line in phases)
    spans = json.loads((tmp_path / "t.json").read_text())
    assert [r["workers"] for r in spans] == [1, 2]
    assert {"key_data.load_stats", "executor.run_pairs", "xlsx.write_report_xlsx"} <= {s["label"] for s in spans[0]["spans"]}


def test_tensor_files_script_runs(tmp_path, monkeypatch, capsys):
    """benchmarks/tensor_files.py: both writers write every step's files, and the figures come out."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import tensor_files

    out = tmp_path / "r.json"
    assert tensor_files.main(["--reps", "2", "--steps", "3", "--dir", str(tmp_path), "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert set(summary) >= {"packed", "folders", "paired_cpu_ratio"} and summary["paired_cpu_ratio"] >= 0
    assert list(tmp_path.iterdir()) == [out]  # its folders removed
    assert "paired CPU ratio packed / folders" in capsys.readouterr().out
    for packed, files in ((True, 3 * 2), (False, 22 * 2)):  # what a run writes: a file a call, or a tensor
        root = tmp_path / str(packed)
        tensor_files.one_run(str(root), packed, 2)
        assert sum(1 for p in root.rglob("*") if p.is_file()) == files
    sys.modules.pop("tensor_files", None)


def test_startup_bytecode_copy_is_compiled_and_runs(tmp_path, monkeypatch):
    """benchmarks/startup.py --bytecode: the installed-like copy holds a .pyc per module and the bundled
    folders, and `rlprobe compare` runs from it with the same verdict."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import startup

    copy = startup.installed_copy(BENCHMARKS.parent, tmp_path / "installed")
    assert sorted(p.name for p in (copy / "rlprobe" / "comparison" / "__pycache__").glob("run.*.pyc"))
    assert (copy / "sql" / "key_data.sql").is_file()
    a, b = startup.make_tiny_dumps(tmp_path, "msprobe")
    wall, cpu = startup.startup_seconds(copy, a, b, tmp_path / "out")
    assert wall > 0 and cpu > 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["counts"] == {"mismatch": 1} and summary["first_divergence"]["key"] == "x"  # B is A + 1e-3
    sys.modules.pop("startup", None)


def test_core_scaling_script_measures_one_process_against_two(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import core_scaling

    out = tmp_path / "r.json"
    assert core_scaling.main(["--repeat", "1", "--scale", "0.01", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert sorted(figures) == ["blake2b", "numpy sort", "python loop"]
    for f in figures.values():
        assert f["one_s"] > 0 and f["two_s"] > 0 and f["throughput_of_two"] == 2 * f["one_s"] / f["two_s"]
    assert "two cores do" in capsys.readouterr().out
    sys.modules.pop("core_scaling", None)


def test_two_cores_are_two_physical_cores(monkeypatch):
    """core_scaling.py --two-cores (benchmarks/gpu_checks.sh runs the comparison on them with taskset)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import core_scaling

    siblings = {0: (0, 0), 1: (0, 0), 2: (0, 1), 3: (0, 1)}  # two hyper-threads a core
    assert core_scaling.two_cores([0, 1, 2, 3], siblings) == [0, 2]
    assert core_scaling.two_cores([1, 3], siblings) == [1, 3]
    assert core_scaling.two_cores([0, 1], siblings) is None  # one core's two threads
    assert core_scaling.two_cores([4, 5], {}) == [4, 5]  # no topology: each CPU its own core
    assert core_scaling.two_cores([7], siblings) is None and core_scaling.two_cores([], siblings) is None
    assert set(core_scaling.topology()) <= set(range(4096))
    sys.modules.pop("core_scaling", None)


def test_compare_speed_keeps_a_carried_pythonpath_and_returns_its_figures(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import compare_speed

    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    assert compare_speed.rlprobe_env(Path("/c")).get("PYTHONPATH") == os.pathsep.join(["/c", "/tmp/site"])
    monkeypatch.delenv("PYTHONPATH")
    assert compare_speed.rlprobe_env(Path("/c"))["PYTHONPATH"] == "/c"
    runs = {"load_average_1min": [1.0]}
    for kind, values in (("s", (0.5, 1.5, 1.0)), ("cpu_s", (0.6, 2.0, 1.8)), ("peak_MB", (100, 300, 310))):
        for name, value in zip(("tiny/w2", "rlprobe_small/w1", "rlprobe_small/w2"), values):
            runs[f"rlprobe/{name}/{kind}"] = [value]
    figures = compare_speed.report_targets(runs, {"tiny": None, "rlprobe_small": None}, ["rlprobe"])
    assert figures == {"rlprobe": {"start_up_s": 0.5, "rlprobe_small": {
        "whole_w2_s": 1.0, "whole_w1_s": 1.5, "peak_MB": 310, "w2_over_w1_beyond_start_up": 2.0}}}
    assert "2 workers 2.00 x faster than 1" in capsys.readouterr().out
    for name, value in (("tiny/w2", 0.6), ("rlprobe_small/w1", 1.2), ("rlprobe_small/w2", 2.0)):
        runs[f"baseline/{name}/s"] = [value]  # the baseline: 1.2 x this start-up, 0.8 x / 2 x the workloads
    import argparse

    import results

    monkeypatch.setattr(results, "RESULTS", Path(str(tmp_path)) / "RESULTS.md")
    compare_speed.record_results(runs, figures, {"tiny": None, "rlprobe_small": None}, ["rlprobe", "baseline"],
                                 argparse.Namespace(repeat=1, workloads="rlprobe_small", baseline="/b"))
    recorded = (Path(str(tmp_path)) / "RESULTS.md").read_text(encoding="utf-8")
    assert "| start-up (one-step compare) | 0.50 s |  | 0.60 s |  |  | 1.20 |" in recorded
    assert "| rlprobe_small | 1.00 s | 1.50 s | 1.80 s | 310 MB |  | 2.00 · 0.80 |" in recorded
    assert "--workloads rlprobe_small --baseline BASE --record" in recorded
    sys.modules.pop("compare_speed", None)
    sys.modules.pop("results", None)


def test_compare_scaling_script_reports_each_size(tmp_path, monkeypatch, capsys):
    """benchmarks/compare_scaling.py at two small sizes: the pairs it counts are the pairs compared (the
    comparison's own key_data.parquet says how many), with time, memory and the output files' sizes."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import compare_scaling
    import compare_workloads

    import results

    monkeypatch.setattr(results, "RESULTS", tmp_path / "RESULTS.md")
    rows = compare_scaling.main(["--ranks", "1,2", "--cache", str(tmp_path / "cache"), "--tmp", str(tmp_path),
                                 "--workers", "1", "--record"])
    recorded = (tmp_path / "RESULTS.md").read_text(encoding="utf-8")
    assert "| 2 | 6,400 |" in recorded and "--ranks 1,2 --workers 1 --record" in recorded
    per_rank = compare_workloads.RL_STEPS * compare_workloads.RL_KEYS
    assert [r["pairs"] for r in rows] == [per_rank, 2 * per_rank]
    for r in rows:
        assert r["wall_s"] > 0 and r["cpu_s"] > 0 and r["peak_rss"] > 0 and r["outputs"]["key_data.parquet"] > 0
    a, b = compare_workloads.rlprobe_small(tmp_path / "cache", 2)
    out = tmp_path / "check"
    import rlprobe
    import pyarrow.parquet as pq

    rlprobe.compare(a, b, out)
    assert pq.read_metadata(out / "key_data.parquet").num_rows == 2 * per_rank
    assert "peak memory under 1 GB at 6,400 pairs" in capsys.readouterr().out
    sys.modules.pop("compare_scaling", None)
    sys.modules.pop("results", None)


def test_results_sections_are_replaced_whole_and_others_kept(tmp_path, monkeypatch):
    """benchmarks/results.py: a script's section is appended once, then replaced by its latest figures; the
    hand-written text and other scripts' sections stay as they were; a section without its end marker is an
    error naming it, and the file is left as it was."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import results

    path = tmp_path / "RESULTS.md"
    path.write_text("# Benchmark results\n\nhand-written text\n", encoding="utf-8")
    results.record("one", "First", "python one.py", ["a", "b"], [[1, 2.34567]], path=path)
    results.record("two", "Second", "python two.py", ["x"], [["y|z"]], path=path)
    results.record("one", "First", "python one.py", ["a", "b"], [[3, None]], path=path)
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# Benchmark results\n\nhand-written text\n")
    assert text.count("<!-- results:one ") == 1 and "| 3 |  |" in text and "2.35" not in text
    assert "| y\\|z |" in text and text.index("results:one") < text.index("results:two")
    with pytest.raises(ValueError, match="2 headers"):
        results.record("one", "First", "python one.py", ["a", "b"], [[1]], path=path)
    broken = text.replace("<!-- /results:two -->", "")
    path.write_text(broken, encoding="utf-8")
    with pytest.raises(ValueError, match="'two' has no end marker"):
        results.record("two", "Second", "python two.py", ["x"], [[1]], path=path)
    assert path.read_text(encoding="utf-8") == broken
    sys.modules.pop("results", None)
