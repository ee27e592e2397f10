"""PNG plots: the key x step grids against a row-by-row reference, bounded image sizes, the
gradient plots (ten worst by default, one per parameter on request, file names)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matplotlib.image import imread

from rlprobe.report.plots import (_file_name, _series_by_param, key_step_grids, write_grad_plots, write_key_data_plots,
                                  write_plots)

STATUSES = ["match", "stats_only_match", "mismatch", "error", "only_in_a"]


def _key_data(rng: np.random.Generator, n: int, steps: int = 6) -> pa.Table:
    keys = ["responses", "log_prob", "ref_log_prob", "advantages"]
    errs = rng.choice([None, float("nan"), float("inf"), 0.0, 1e-12, 3e-4, 0.5, 20.0], n).tolist()
    return pa.table({
        "key": pa.array(rng.choice(keys, n).tolist()),
        "step": pa.array(rng.integers(0, steps, n), pa.int64()),
        "status": pa.array(rng.choice(STATUSES, n).tolist()),
        "max_rel_err": pa.array(errs, pa.float64()),
        "flow_position": pa.array(rng.integers(0, 9, n), pa.int64()),
        "is_first_divergence": pa.array(rng.choice([True, False, None], n, p=[0.05, 0.9, 0.05]).tolist()),
    })


def _reference(rows: list[dict]):
    """The plots' cells, computed row by row as the first version of the report did."""
    keys = sorted({r["key"] for r in rows}, key=lambda k: (min(r["flow_position"] for r in rows if r["key"] == k), k))
    steps = sorted({r["step"] for r in rows})
    grid = np.full((len(keys), len(steps)), np.nan)
    worst = np.full((len(keys), len(steps)), np.nan)
    for r in rows:
        i, j, err = keys.index(r["key"]), steps.index(r["step"]), r["max_rel_err"]
        value = -8.0 if r["status"] in ("match", "stats_only_match") else (
            math.log10(max(err, 1e-8)) if err is not None and math.isfinite(err) else 1.0)
        grid[i, j] = value if np.isnan(grid[i, j]) else max(grid[i, j], value)
        e = 0.0 if err is None else err
        if not math.isnan(e):
            worst[i, j] = e if np.isnan(worst[i, j]) else max(worst[i, j], e)
    first = sorted({(keys.index(r["key"]), steps.index(r["step"])) for r in rows if r["is_first_divergence"]})
    return keys, steps, grid, worst, first


@pytest.mark.parametrize("seed", range(6))
def test_key_step_grids_equal_a_row_by_row_reference(seed: int):
    table = _key_data(np.random.default_rng(seed), n=300 if seed else 3)
    keys, steps, grid, worst, first = key_step_grids(table)
    r_keys, r_steps, r_grid, r_worst, r_first = _reference(table.to_pylist())
    assert (keys, steps) == (r_keys, r_steps)
    np.testing.assert_array_equal(grid, r_grid)
    np.testing.assert_array_equal(worst, r_worst)
    assert sorted(set(first)) == r_first


def test_key_data_heatmap_of_a_long_run_stays_a_readable_size(tmp_path: Path):
    table = _key_data(np.random.default_rng(7), n=20_000, steps=1_000)
    pq.write_table(table, tmp_path / "key_data.parquet")
    written = write_key_data_plots(tmp_path)
    assert [p.name for p in written] == ["key_data_heatmap.png", "key_data_max_rel_err.png"]
    height, width = imread(written[0]).shape[:2]
    assert width <= 16 * 120 and height <= 12 * 120  # was 0.5 inch per step: 60,000 pixels wide


def _grad_tables(out: Path, params: list[str], steps: int, monitors=("actor",), ranks=(0,)) -> None:
    rng = np.random.default_rng(0)
    rows, step_rows = [], []
    for monitor in monitors:
        for rank in ranks:
            for step in range(steps):
                for k, param in enumerate(params):
                    sim = None if param == "only_in_b.weight" else float(1.0 - 0.01 * k * step - rng.random() * 1e-3)
                    rows.append({"monitor": monitor, "rank": rank, "step": step, "param": param, "similarity": sim})
                step_rows.append({"monitor": monitor, "rank": rank, "step": step,
                                  "weighted_similarity": 1.0 - 0.02 * step, "flagged": step >= 2})
    pq.write_table(pa.Table.from_pylist(rows[::-1]), out / "grads.parquet")  # steps out of order on purpose
    pq.write_table(pa.Table.from_pylist(step_rows), out / "grad_steps.parquet")


def test_grad_plots_every_param_and_file_names(tmp_path: Path):
    params = [f"layers.{i}.mlp.weight" for i in range(12)] + ["emb/tok weight", "A.w", "a.w", "only_in_b.weight"]
    _grad_tables(tmp_path, params, steps=5)
    default = write_grad_plots(tmp_path)
    assert [p.name for p in default] == ["grad_similarity.png", "grad_worst_params.png"]
    every = write_grad_plots(tmp_path, every_param=True)
    pictures = sorted(p.name for p in every if p.parent.name == "grad_params")
    # one per parameter with a similarity (only_in_b.weight has none); names made safe and unique
    assert len(pictures) == len(params) - 1
    assert "emb_tok_weight.png" in pictures and {"A.w.png", "a.w~2.png"} <= set(pictures)
    assert all((tmp_path / "plots" / "grad_params" / n).stat().st_size > 1000 for n in pictures)


def test_grad_plots_per_monitor_and_rank(tmp_path: Path):
    _grad_tables(tmp_path, ["w", "b"], steps=3, monitors=("actor", "critic"), ranks=(0, 1))
    names = sorted(str(p.relative_to(tmp_path / "plots")) for p in write_grad_plots(tmp_path, every_param=True))
    assert "grad_similarity_critic_rank1.png" in names and "grad_worst_params_actor_rank0.png" in names
    assert "grad_params_critic_rank0/w.png" in names and len(names) == 4 * (2 + 2)


def test_worst_params_and_series(tmp_path: Path):
    table = pa.table({"step": [2, 0, 1, 0, 1], "param": ["b", "b", "b", "a", "a"],
                      "similarity": [0.5, 1.0, 0.9, 1.0, 0.99]})
    series = _series_by_param(table)
    assert list(series) == ["a", "b"]
    assert series["b"][0].tolist() == [0, 1, 2] and series["b"][1].tolist() == [1.0, 0.9, 0.5]
    assert _series_by_param(table.slice(0, 0)) == {}
    _grad_tables(tmp_path, ["w"], steps=2)
    with pytest.raises(ValueError, match="worst"):
        write_grad_plots(tmp_path, worst=0)


def test_file_names():
    used: set[str] = set()
    assert [_file_name(n, used) for n in ["a/b", "a_b", "..", "x.y", "X.Y"]] == ["a_b", "a_b~2", "param", "x.y", "X.Y~2"]


def test_write_plots_without_gradients_writes_key_data_plots_only(tmp_path: Path):
    pq.write_table(_key_data(np.random.default_rng(1), n=40), tmp_path / "key_data.parquet")
    assert [p.name for p in write_plots(tmp_path, every_param=True)] == ["key_data_heatmap.png",
                                                                        "key_data_max_rel_err.png"]
