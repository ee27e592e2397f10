"""Gradient comparison: msprobe parity, XOR/popcount, flag rule, mismatched runs, outputs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import rlprobe
from rlprobe.comparison.grads import agreeing_bits, compare_grads
from rlprobe.compat.msprobe import GradComparator


def _grad_fixture(fixtures_dir: Path) -> Path:
    return fixtures_dir / "msprobe" / "grad"


def test_similarities_equal_msprobe_exactly(fixtures_dir: Path, tmp_path: Path):
    grad = _grad_fixture(fixtures_dir)
    summary = GradComparator.compare_distributed(str(grad / "run_a"), str(grad / "run_b"), str(tmp_path / "out"))
    expected = (grad / "expected" / "rank0" / "similarities.csv").read_bytes()
    assert (tmp_path / "out" / "rank0" / "similarities.csv").read_bytes() == expected
    assert (tmp_path / "out" / "grads" / "rank0" / "similarities.csv").read_bytes() == expected
    first = summary["grad_first_flagged"]
    assert (first["step"], first["rank"], first["monitor"]) == (2, 0, "default")
    assert first["weighted_similarity"] == 0.8820754716981132
    assert [p["param"] for p in first["worst_params"][:2]] == ["2.weight", "0.weight"]
    assert (tmp_path / "out" / "plots" / "grad_similarity.png").stat().st_size > 1000
    # msprobe's picture per parameter, in msprobe's place
    params = [line.split(",")[0] for line in expected.decode("utf-8-sig").splitlines()[1:-1]]
    pictures = sorted(p.name for p in (tmp_path / "out" / "rank0" / "similarities_picture").iterdir())
    assert pictures == sorted(f"{p}_similarities.png" for p in params) and len(params) == 4
    steps = pq.read_table(tmp_path / "out" / "grad_steps.parquet").to_pylist()
    assert [s["flagged"] for s in steps] == [False, False, True, True]
    assert "2.weight" in steps[2]["reason"] and "dropped" in steps[2]["reason"]


def test_msprobe_l2_summary_stats_read_within_1e6(fixtures_dir: Path):
    run = _grad_fixture(fixtures_dir) / "run_a"
    rows = rlprobe.open(run).arrow("grad").to_pylist()
    for r in rows:
        with open(run / "rank0" / f"grad_summary_{r['step']}.csv", newline="", encoding="utf-8-sig") as fh:
            rec = next(x for x in csv.DictReader(fh) if x["param_name"] == r["param"])
        intervals = [float(v) for k, v in rec.items() if k.startswith("(")]
        assert r["bucket_fractions"] == pytest.approx(intervals, abs=1e-6)
        assert r["bounds"] == [-0.1, 0.0, 0.1]
        for col in ("max", "min", "norm"):
            assert r[col] == pytest.approx(float(rec[col]), abs=1e-6)
        # the sign map agrees with the distribution: positives are the buckets above 0
        signs = np.load(run / r["sign_file"])
        assert signs.mean() == pytest.approx(sum(intervals[2:]), abs=1e-6)


@pytest.mark.parametrize("numel", [1, 7, 8, 9, 130])
def test_agreeing_bits_ignores_padding(numel: int):
    rng = np.random.default_rng(numel)
    a, b = rng.random(numel) > 0.5, rng.random(numel) > 0.5
    pa_, pb = np.packbits(a), np.packbits(b)
    if numel % 8:
        pb[-1] |= (1 << (8 - numel % 8)) - 1  # garbage in the padding must not count
    assert agreeing_bits(pa_, pb, numel) == int(np.sum(a == b))


def _run(path: Path, steps: int, seed: int, perturb_from: int | None = None, widths=(8, 6, 3), level="L2",
         extra: bool = False, updates_per_step: int = 1) -> Path:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(widths[0], widths[1]), torch.nn.Tanh(), torch.nn.Linear(widths[1], widths[2])]
    if extra:
        layers.append(torch.nn.Linear(widths[2], 2))
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(seed)
    with rlprobe.Probe(path) as probe:
        probe.monitor_grads(model, optimizer=opt, name="actor", level=level, bounds=[-0.1, 0, 0.1])
        for step in range(steps):
            x = torch.randn(16, widths[0], generator=g)
            if perturb_from is not None and step >= perturb_from:
                x = x + torch.randn(x.shape, generator=g)
            for _ in range(updates_per_step):
                opt.zero_grad()
                model(x).pow(2).mean().backward()
                opt.step()
            probe.step()
    return path


def test_identical_runs_not_flagged_and_perturbed_step_found(tmp_path: Path):
    a = _run(tmp_path / "a", 4, seed=1)
    b = _run(tmp_path / "b", 4, seed=1)
    c = _run(tmp_path / "c", 4, seed=1, perturb_from=2)
    tables, first = compare_grads(rlprobe.open(a), rlprobe.open(b))
    assert first is None
    assert all(s == 1.0 for s in tables["grads"]["similarity"].to_pylist())
    tables, first = compare_grads(rlprobe.open(a), rlprobe.open(c))
    assert first["step"] == 2 and first["monitor"] == "actor"
    # the weighted similarity is sum(agreeing bits) / sum(elements)
    rows = [r for r in tables["grads"].to_pylist() if r["step"] == 2]
    step2 = next(s for s in tables["grad_steps"].to_pylist() if s["step"] == 2)
    assert step2["weighted_similarity"] == sum(r["same_count"] for r in rows) / sum(r["numel"] for r in rows)


def test_flag_rule_thresholds_are_configurable(fixtures_dir: Path):
    grad = _grad_fixture(fixtures_dir)
    a, b = rlprobe.open(grad / "run_a"), rlprobe.open(grad / "run_b")
    tables, first = compare_grads(a, b, max_drop=0.2)
    flagged = {(r["step"], r["param"]) for r in tables["grads"].to_pylist() if r["flagged"]}
    assert flagged == {(3, "0.weight"), (3, "0.bias"), (3, "2.weight"), (3, "2.bias")}
    assert first["step"] == 3
    tables, first = compare_grads(a, b, first_step_min=1.01)  # step 0 below the bar
    assert first["step"] == 0 and "first step" in first["reason"]


def test_mismatched_params_shapes_and_steps_are_reported(tmp_path: Path):
    a = _run(tmp_path / "a", 3, seed=1)
    b = _run(tmp_path / "b", 2, seed=1, widths=(8, 5, 3), extra=True)
    tables, _ = compare_grads(rlprobe.open(a), rlprobe.open(b))
    status = {(r["step"], r["param"]): r["status"] for r in tables["grads"].to_pylist()}
    assert status[(0, "0.weight")] == "shape_mismatch"
    assert status[(0, "2.bias")] == "compared"
    assert status[(0, "3.weight")] == "only_in_b"
    assert status[(2, "0.weight")] == "only_in_a"
    steps = {s["step"]: s for s in tables["grad_steps"].to_pylist()}
    assert "unmatched" in steps[0]["reason"] and steps[2]["weighted_similarity"] is None


def test_steps_and_ranks_select_gradient_rows(tmp_path: Path, fixtures_dir: Path):
    from rlprobe.pipeline.compare_command import compare

    # two optimizer steps per probe step in A, three in B: probe step 1 is A's 2-3 and B's 3-5
    a = rlprobe.open(_run(tmp_path / "a", 3, seed=1, updates_per_step=2))
    b = rlprobe.open(_run(tmp_path / "b", 3, seed=1, updates_per_step=3))
    tables, _ = compare_grads(a, b, steps=[1])
    grads = tables["grads"].to_pylist()
    assert {r["step"] for r in grads} == {2, 3, 4, 5}  # either side's selection, on both sides
    assert {r["status"] for r in grads} == {"compared"}
    assert [s["step"] for s in tables["grad_steps"].to_pylist()] == [2, 3, 4, 5]
    assert {r["step"] for r in compare_grads(a, b, steps=[1], ranks=[0])[0]["grads"].to_pylist()} == {2, 3, 4, 5}
    empty, first = compare_grads(a, b, ranks=[1])
    assert empty["grads"].num_rows == 0 and first is None
    # msprobe rows (no probe step): the optimizer step; the first selected step gets the 0.97 rule
    grad = _grad_fixture(fixtures_dir)
    summary = compare(grad / "run_a", grad / "run_b", tmp_path / "out", steps=[2, 3], reports=False)
    assert summary["grad_first_flagged"]["step"] == 2
    kept = pq.read_table(tmp_path / "out" / "grad_steps.parquet")["step"].to_pylist()
    assert kept == [2, 3]


def test_stats_only_comparison_without_sign_maps(tmp_path: Path):
    a = _run(tmp_path / "a", 2, seed=1, level="L0")
    b = _run(tmp_path / "b", 2, seed=1, level="L0", perturb_from=1)
    summary = GradComparator.compare_distributed(str(a), str(b), str(tmp_path / "compat"))  # no pictures to draw
    assert summary["grad_first_flagged"]["step"] == 1
    assert not (tmp_path / "compat" / "rank0" / "similarities_picture").exists()
    tables, first = compare_grads(rlprobe.open(a), rlprobe.open(b))
    rows = tables["grads"].to_pylist()
    assert {r["status"] for r in rows} == {"stats_only"}
    assert all(r["digest_equal"] for r in rows if r["step"] == 0)
    assert first["step"] == 1 and any("digests differ" in (p["reason"] or "") for p in first["worst_params"])


def test_compare_cli_outputs_for_rlprobe_dumps(tmp_path: Path):
    from rlprobe.pipeline.compare_command import compare

    a = _run(tmp_path / "a", 3, seed=1)
    c = _run(tmp_path / "c", 3, seed=1, perturb_from=1)
    summary = compare(a, c, tmp_path / "out")
    assert summary["grad_first_flagged"]["step"] == 1
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["grad_first_flagged"]["step"] == 1
    assert (tmp_path / "out" / "grads" / "rank0" / "similarities.csv").exists()
    from openpyxl import load_workbook

    assert "Grads" in load_workbook(tmp_path / "out" / "report.xlsx", read_only=True).sheetnames


def test_flagged_gradients_are_the_verdict_when_key_data_agree(tmp_path: Path):
    """A gradient-only comparison must not say "no divergence" when the gradients part ways."""
    from click.testing import CliRunner

    from rlprobe.cli import main

    a = _run(tmp_path / "a", 3, seed=1)
    b = _run(tmp_path / "b", 3, seed=1)
    c = _run(tmp_path / "c", 3, seed=1, perturb_from=1)
    runner = CliRunner()
    same = runner.invoke(main, ["compare", str(a), str(b), "-o", str(tmp_path / "same"), "--fail-on-diff"])
    assert same.exit_code == 0 and "no divergence" in same.output, same.output
    res = runner.invoke(main, ["compare", str(a), str(c), "-o", str(tmp_path / "out"), "--fail-on-diff"])
    assert res.exit_code == 1, res.output
    assert "gradients flagged: monitor 'actor', step 1" in res.output and "no divergence" not in res.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["first_divergence"] is None
    assert summary["suspect"].startswith("the gradients of monitor 'actor' part ways at its optimizer step 1")
    assert summary["advice"].startswith("no key data were compared but the gradients part ways")
    assert summary["next_config"] == {"rlprobe_config": {"dump_path": "./rlprobe_dump_modules",
                                                         "stages": ["actor_update"], "step_start": 1, "step_end": 1}}
    md = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    assert md.startswith("## rlprobe: ❌ gradients flagged: monitor 'actor', step 1, rank 0")


def test_report_has_a_similarity_matrix_and_the_flagged_rows(tmp_path: Path):
    from openpyxl import load_workbook

    from rlprobe.pipeline.compare_command import compare

    a = _run(tmp_path / "a", 3, seed=1)
    b = _run(tmp_path / "b", 3, seed=1, perturb_from=1, extra=True)  # one more layer: 2 params only in B
    compare(a, b, tmp_path / "out")
    grads = pq.read_table(tmp_path / "out" / "grads.parquet").to_pylist()
    book = load_workbook(tmp_path / "out" / "report.xlsx")
    assert book.sheetnames == ["Summary", "Grads", "Grad flags", "Grad similarity"]
    ws = book["Grad similarity"]
    rows = [[c.value for c in r] for r in ws.iter_rows()]
    assert rows[0] == ["monitor", "rank", "param", 0, 1, 2] and ws.freeze_panes == "D2"
    by_cell = {(r[2], step): (value, ws.cell(i + 1, j + 4)) for i, r in enumerate(rows) if i > 0
               for j, (step, value) in enumerate(zip(rows[0][3:], r[3:]))}
    for g in grads:
        value, cell = by_cell[(g["param"], g["step"])]
        if g["status"] == "compared":
            assert value == pytest.approx(g["similarity"], abs=0)
            assert (cell.fill.fill_type == "solid" and cell.fill.fgColor.rgb == "FFFFC7CE") == bool(g["flagged"])
        else:  # only in B: the status, in amber
            assert value == g["status"] == "only_in_b" and cell.fill.fgColor.rgb == "FFFFEB9C"
    weighted = rows[-1]
    steps = {s["step"]: s for s in pq.read_table(tmp_path / "out" / "grad_steps.parquet").to_pylist()}
    assert weighted[:3] == ["actor", 0, "(weighted)"]
    assert weighted[3:] == [pytest.approx(steps[s]["weighted_similarity"], abs=0) for s in (0, 1, 2)]
    flags = [[c.value for c in r] for r in book["Grad flags"].iter_rows()]
    assert len(flags) - 1 == sum(1 for g in grads if g["flagged"] or g["status"] != "compared")
    assert flags[0][:5] == ["monitor", "rank", "step", "param", "status"] and "flag_reason" in flags[0]
    assert "max_a" not in flags[0] and "zero_fraction_b" not in flags[0]  # in grads.parquet only
    # capped, the sheet keeps the flagged rows before the parameters found on one side only
    from rlprobe.report.comparison_files import write_tables
    from rlprobe.report.xlsx import _pick_rows

    (tmp_path / "again").mkdir()
    sheet = write_tables(tmp_path / "again", {"key_data": pq.read_table(tmp_path / "out" / "key_data.parquet"),
                                              "grads": pq.read_table(tmp_path / "out" / "grads.parquet"),
                                              "grad_steps": pq.read_table(tmp_path / "out" / "grad_steps.parquet")}
                         )["extra_sheets"]["Grad flags"]
    n_flagged = sum(1 for g in grads if g["flagged"])
    assert 0 < n_flagged < sheet.num_rows
    picked = sheet.take(_pick_rows(sheet, None, n_flagged))
    assert all(picked["flagged"].to_pylist())


@pytest.mark.parametrize("numpy_bitwise_count", [True, False])
def test_same_counts_of_a_whole_file_equal_pair_by_pair(tmp_path: Path, monkeypatch, numpy_bitwise_count: bool):
    """The per-file count (one XOR, padding cleared, prefix counts) against agreeing_bits, with
    numpy's popcount and with the table used before numpy 2."""
    from rlprobe.comparison.grads import _same_counts_in_file

    if not numpy_bitwise_count:
        monkeypatch.delattr(np, "bitwise_count", raising=False)

    rng = np.random.default_rng(3)
    numel = np.array([13, 0, 8, 1, 7, 9, 4096, 4099, 3])
    nbytes = (numel + 7) // 8
    offsets = np.concatenate([[0], np.cumsum(nbytes)[:-1]]) + 5  # 5 bytes before the first parameter
    size = int(offsets[-1] + nbytes[-1] + 2)
    a = rng.integers(0, 256, size, dtype=np.uint8)  # garbage in padding bits and gaps too
    b = a.copy()
    flip = rng.random(size) < 0.3
    b[flip] = rng.integers(0, 256, int(flip.sum()), dtype=np.uint8)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    got = _same_counts_in_file(tmp_path / "a.npy", tmp_path / "b.npy", offsets, numel)
    expected = [agreeing_bits(a[o:o + k], b[o:o + k], int(n)) for o, k, n in zip(offsets, nbytes, numel)]
    assert got.tolist() == expected
    # ranges in any order, with gaps, inside one word
    odd = np.array([9, 0, 3]), np.array([3, 16, 5])
    got = _same_counts_in_file(tmp_path / "a.npy", tmp_path / "b.npy", *odd)
    assert got.tolist() == [agreeing_bits(a[o:o + (n + 7) // 8], b[o:o + (n + 7) // 8], int(n)) for o, n in zip(*odd)]
    # a file too short for the last parameter, or not a byte array: counted one by one instead
    np.save(tmp_path / "short.npy", b[:-3])
    assert _same_counts_in_file(tmp_path / "a.npy", tmp_path / "short.npy", offsets, numel) is None
    np.save(tmp_path / "floats.npy", b.astype(np.float32))
    assert _same_counts_in_file(tmp_path / "a.npy", tmp_path / "floats.npy", offsets, numel) is None


def test_unreadable_sign_maps_are_errors_of_their_rows(tmp_path: Path):
    a = _run(tmp_path / "a", 3, seed=1)
    b = _run(tmp_path / "b", 3, seed=1)
    broken = sorted(b.rglob("signs.npy"))
    assert len(broken) == 3
    step1 = next(f for f in broken if "step=1" in str(f))
    step1.write_bytes(step1.read_bytes()[:-4])  # truncated
    step2 = next(f for f in broken if "step=2" in str(f))
    step2.write_bytes(b"not a numpy file")
    tables, _ = compare_grads(rlprobe.open(a), rlprobe.open(b))
    rows = {(r["step"], r["param"]): r for r in tables["grads"].to_pylist()}
    assert all(r["status"] == "compared" and r["similarity"] == 1.0 for (s, _), r in rows.items() if s == 0)
    for step in (1, 2):  # every pair of the file is an error naming its parameter and step
        assert all(r["status"] == "error" and f"'{p}' step {step}" in r["message"]
                   for (s, p), r in rows.items() if s == step)
    assert rows[(1, "2.bias")]["similarity"] is None


def _run_with_grad(path: Path, param: str, grad: torch.Tensor | None, steps: int = 2, level: str = "L1") -> Path:
    """_run's model and data, the gradient of `param` replaced by `grad` (None: as computed) at every step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    if grad is not None:
        dict(model.named_parameters())[param].register_hook(lambda g: grad.clone())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with rlprobe.Probe(path) as probe:
        probe.monitor_grads(model, optimizer=opt, name="actor", level=level)
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(16, 8, generator=g)).pow(2).mean().backward()
            opt.step()
            probe.step()
    return path


@pytest.mark.parametrize("level", ["L1", "L0"])
def test_a_gradient_within_rounding_of_zero_is_no_divergence_unless_judged_bitwise(tmp_path: Path, level: str):
    """A bias whose gradient is zero but for rounding (as an attention key bias's: softmax ignores it) has
    signs, digests and norms that two devices do not share; within rounding of zero against the step's
    largest gradient norm it is not flagged, while a tolerance of 0 still sees it (docs/grads.md)."""
    from rlprobe.comparison.tolerance import Tolerance

    noise = 1e-12 * torch.tensor([1.0, -1.0, 1.0])
    a = _run_with_grad(tmp_path / "a", "2.bias", noise, level=level)
    b = _run_with_grad(tmp_path / "b", "2.bias", -2 * noise, level=level)  # other signs, twice the size
    tables, first = compare_grads(rlprobe.open(a), rlprobe.open(b))
    bias = [r for r in tables["grads"].to_pylist() if r["param"] == "2.bias"]
    assert first is None and {r["rounding"] for r in bias} == {"within rounding of zero"}
    assert {r["flagged"] for r in tables["grads"].to_pylist()} == {False}
    if level == "L1":
        assert {r["similarity"] for r in bias} == {0.0}
    tables, first = compare_grads(rlprobe.open(a), rlprobe.open(b), tolerance=Tolerance(rtol=0.0, atol=0.0))
    assert first["step"] == 0 and first["worst_params"][0]["param"] == "2.bias"
    assert {r["rounding"] for r in tables["grads"].to_pylist()} == {None}


def test_a_gradient_beyond_rounding_is_flagged_whatever_its_statistics(tmp_path: Path):
    """Rounding flips signs only where the gradient is near zero: a gradient of equal norm whose signs are
    reversed (similarity below a coin's 0.5) is flagged under the default tolerance; one of another norm too."""
    grad = torch.linspace(-1.0, 1.0, 18).reshape(6, 3).t().contiguous()
    a = _run_with_grad(tmp_path / "a", "2.weight", grad)
    b = _run_with_grad(tmp_path / "b", "2.weight", -grad)
    c = _run_with_grad(tmp_path / "c", "2.weight", grad * (1 + 1e-3))
    for other, reason in ((b, "similarity 0.0000 < 0.9700 at its first step"), (c, None)):
        tables, first = compare_grads(rlprobe.open(a), rlprobe.open(other))
        row = next(r for r in tables["grads"].to_pylist() if r["param"] == "2.weight" and r["step"] == 0)
        assert row["rounding"] is None
        if reason is not None:
            assert first["step"] == 0 and row["flag_reason"] == reason
