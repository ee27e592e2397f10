"""`rlprobe compare` exit codes and output, and msprobe's SingleComparator call shape."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import openpyxl
import pytest
from click.testing import CliRunner

import rlprobe
from rlprobe.cli import main


def _dump(path, value):
    with rlprobe.Probe(path) as p:
        p.save({"responses": np.arange(8), "ref_log_prob": value})
        p.step()
    return path


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_compare_prints_verdict_and_exit_codes(tmp_path):
    a = _dump(tmp_path / "a", np.ones(8, np.float32))
    b = _dump(tmp_path / "b", np.ones(8, np.float32) * 1.5)
    result = run("compare", a, b, "-o", tmp_path / "out", "--quiet")
    assert result.exit_code == 0, result.output
    assert "first divergence" in result.output and "ref_log_prob" in result.output
    assert "reference model" in result.output
    assert run("compare", a, b, "-o", tmp_path / "out2", "--quiet", "--fail-on-diff").exit_code == 1
    assert run("compare", a, a, "-o", tmp_path / "out3", "--quiet", "--fail-on-diff").exit_code == 0
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["first_divergence"]["key"] == "ref_log_prob"


def test_compare_usage_and_unreadable_runs(tmp_path):
    a = _dump(tmp_path / "a", np.ones(2, np.float32))
    assert run("compare", a, tmp_path / "missing", "-o", tmp_path / "o").exit_code == 3
    assert run("compare", a, a, "-o", tmp_path / "o", "--steps", "x-y").exit_code == 2
    assert run("compare", a, a).exit_code == 2  # -o is required
    for tolerance in ("nan", "-0.1"):  # no stats-only row could ever match (NaN), or a negative tolerance
        result = run("compare", a, a, "-o", tmp_path / "o", f"--stats-rtol={tolerance}")
        assert result.exit_code == 2 and "is not a tolerance" in result.output
    with pytest.raises(rlprobe.ProbeError, match="stats_rtol must be a finite number >= 0"):
        rlprobe.compare(a, a, tmp_path / "o", stats_rtol=float("nan"))
    assert not (tmp_path / "o").exists()
    (tmp_path / "f").write_text("")
    assert run("compare", a, a, "-o", tmp_path / "f" / "out", "--quiet").exit_code == 3


def test_compare_zh_per_key_files_and_plots(tmp_path):
    a = _dump(tmp_path / "a", np.ones(8, np.float32))
    b = _dump(tmp_path / "b", np.ones(8, np.float32) * 2)
    out = tmp_path / "out"
    result = run("compare", a, b, "-o", out, "--lang", "zh", "--per-key-files", "--plots", "--quiet")
    assert result.exit_code == 0, result.output
    sheet = openpyxl.load_workbook(out / "per_key" / "ref_log_prob.xlsx").active
    headers = [c.value for c in next(sheet.iter_rows(max_row=1))]
    assert headers[:4] == ["step", "rank", "micro_step", "id"] and "相同元素百分比(%)" in headers
    assert (out / "plots" / "key_data_heatmap.png").stat().st_size > 1000


def test_single_comparator_compat(fixtures_dir, tmp_path):
    from rlprobe.compat.msprobe import SingleComparator

    base = fixtures_dir / "msprobe/keydata"
    summary = SingleComparator.compare(str(base / "run_a"), str(base / "run_b"), str(tmp_path / "out"), num_processes=2)
    assert summary["first_divergence"]["key"] == "responses"
    for key in ("log_prob", "responses", "kl_loss"):
        assert (tmp_path / "out" / f"{key}.xlsx").is_file()  # where msprobe users look


def test_plots_leave_the_callers_matplotlib_alone(tmp_path):
    """Library code must not switch a notebook's backend or load pyplot: a fresh process checks."""
    a = _dump(tmp_path / "a", np.ones(8, np.float32))
    b = _dump(tmp_path / "b", np.ones(8, np.float32) * 2)
    code = (
        "import sys, matplotlib; matplotlib.use('svg'); import rlprobe\n"
        "from rlprobe.report.plots import write_key_data_plots\n"
        f"rlprobe.compare({str(a)!r}, {str(b)!r}, {str(tmp_path / 'out')!r})\n"
        f"paths = write_key_data_plots({str(tmp_path / 'out')!r})\n"
        "assert paths and all(p.read_bytes()[:8] == b'\\x89PNG\\r\\n\\x1a\\n' for p in paths), paths\n"
        "assert matplotlib.get_backend() == 'svg', matplotlib.get_backend()\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_compare_plot_every_param_implies_plots(fixtures_dir, tmp_path):
    grad = fixtures_dir / "msprobe" / "grad"
    out = tmp_path / "out"
    result = run("compare", grad / "run_a", grad / "run_b", "-o", out, "--plot-every-param", "--quiet")
    assert result.exit_code == 0, result.output
    params = {line.split(",")[0] for line in
              (grad / "expected" / "rank0" / "similarities.csv").read_text(encoding="utf-8-sig").splitlines()[1:]}
    params.discard("summary")
    assert {p.stem for p in (out / "plots" / "grad_params").glob("*.png")} == params
    assert (out / "plots" / "grad_worst_params.png").exists()


def test_compare_plots_that_cannot_be_written_keep_the_earlier_output(fixtures_dir, tmp_path, monkeypatch):
    grad = fixtures_dir / "msprobe" / "grad"
    out = tmp_path / "out"
    assert run("compare", grad / "run_a", grad / "run_b", "-o", out, "--quiet").exit_code == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    import rlprobe.report.plots as grad_plots

    write_png = grad_plots._write_png

    def folder_where_a_png_goes(path, pixels):  # the PNG's path is taken by a folder: a real IsADirectoryError
        if path.name == "0.weight.png":
            path.mkdir()
        write_png(path, pixels)

    monkeypatch.setattr(grad_plots, "_write_png", folder_where_a_png_goes)
    result = run("compare", grad / "run_a", grad / "run_b", "-o", out, "--plot-every-param", "--quiet")
    assert result.exit_code == 3
    assert "plots cannot be written" in result.output and "0.weight.png" in result.output
    assert "itsearlierfilesarekept" in "".join(result.output.split())  # compared without spaces: wrapped at any width
    assert json.loads((out / "summary.json").read_text())["grad_first_flagged"]["step"] == 2
    assert (out / "grads" / "rank0" / "similarities.csv").exists()
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not (out / "plots").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]


def test_a_selection_that_names_nothing_the_runs_hold_is_a_usage_error(tmp_path):
    """A typo in --keys, or --steps/--ranks outside both runs, compared nothing and printed "no divergence"
    (exit 0, even with --fail-on-diff): now exit 2 naming what was asked and what the runs hold; the OUT of
    an earlier comparison keeps its files. A window wider than the runs, and a selection on runs without key
    data (gradients only), still compare."""
    a = _dump(tmp_path / "a", np.ones(8, np.float32))
    b = _dump(tmp_path / "b", np.ones(8, np.float32) * 1.5)
    out = tmp_path / "out"
    assert run("compare", a, b, "-o", out, "--quiet").exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    typo = run("compare", a, b, "-o", out, "--quiet", "--keys", "ref_log_prob,ref_logprob")
    assert typo.exit_code == 2
    assert "ref_logprob saved by neither run" in typo.output
    assert "keys ref_log_prob, responses, steps 0-0, ranks 0" in typo.output
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    for option, value, said in (("--steps", "5", "(steps 5)"), ("--ranks", "1-2", "(ranks 1, 2)")):
        result = run("compare", a, b, "-o", tmp_path / "o", "--quiet", "--fail-on-diff", option, value)
        assert result.exit_code == 2 and f"the selection {said} matches no key data of either run" in result.output
        assert not (tmp_path / "o").exists()
    wide = run("compare", a, b, "-o", tmp_path / "wide", "--quiet", "--steps", "0-100", "--ranks", "0-7")
    assert wide.exit_code == 0 and "first divergence" in wide.output
    with pytest.raises(rlprobe.ProbeError, match="nosuch saved by neither run"):
        rlprobe.compare(a, b, tmp_path / "api", keys=["nosuch"])


def test_a_selection_on_runs_without_key_data_is_taken(fixtures_dir, tmp_path):
    grad = fixtures_dir / "msprobe" / "grad"
    result = run("compare", grad / "run_a", grad / "run_b", "-o", tmp_path / "g", "--quiet", "--steps", "0-2")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "g" / "summary.json").read_text())["grad_first_flagged"]["step"] == 2


def test_runs_with_nothing_to_compare_say_so(tmp_path):
    """Two dumps that saved nothing read "no divergence: every compared value agrees" (and ✅ in summary.md): an
    agreement on nothing, where a broken capture is the likelier story."""
    for name in ("a", "b"):
        with rlprobe.Probe(tmp_path / name) as p:
            p.step()
    result = run("compare", tmp_path / "a", tmp_path / "b", "-o", tmp_path / "out", "--quiet", "--fail-on-diff")
    assert result.exit_code == 0 and "nothing compared: neither run holds key data" in result.output
    assert "no divergence" not in result.output and "check that both runs saved something" in result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["compared"] == [] and "nothing was compared" in summary["advice"]
    assert (tmp_path / "out" / "summary.md").read_text().startswith("## rlprobe: ⚠️ nothing compared")
    a = _dump(tmp_path / "c", np.ones(8, np.float32))
    run("compare", a, a, "-o", tmp_path / "same", "--quiet")
    assert json.loads((tmp_path / "same" / "summary.json").read_text())["compared"] == ["key_data"]
    checked = run("check", tmp_path / "a", "--no-plots")
    assert checked.exit_code == 0 and "holds statistics only" not in checked.output  # it holds nothing


def test_the_api_takes_selections_as_the_command_does(tmp_path):
    """rlprobe.compare(steps="0-3") or keys="a,b" reached DuckDB as a text (a conversion error), workers="2" a
    TypeError and workers=2.5 ran: each is the command's form now, or a ProbeError naming the argument."""
    a = _dump(tmp_path / "a", np.ones(8, np.float32))
    b = _dump(tmp_path / "b", np.ones(8, np.float32) * 1.5)
    summary = rlprobe.compare(a, b, tmp_path / "o1", keys="ref_log_prob, responses", steps="0-3", ranks=0)
    assert summary["counts"] == {"match": 1, "mismatch": 1}
    assert rlprobe.compare(a, b, tmp_path / "o2", keys="ref_log_prob")["counts"] == {"mismatch": 1}
    for kwargs, said in (({"ranks": ["a"]}, "ranks: 'a' is not a number"), ({"keys": [1]}, "keys: 1 is not a key name"),
                         ({"workers": "2"}, "workers must be a whole number >= 1, not '2'"),
                         ({"workers": 2.5}, "workers must be a whole number >= 1, not 2.5")):
        with pytest.raises(rlprobe.ProbeError, match=said):
            rlprobe.compare(a, b, tmp_path / "bad", **kwargs)
    assert not (tmp_path / "bad").exists()
