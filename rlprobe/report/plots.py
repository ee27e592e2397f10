"""PNG plots of a key-data comparison: where (key x step) the runs differ, and how much."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

DIVERGED = ("mismatch", "shape_mismatch", "dtype_mismatch", "stats_only_mismatch", "error", "only_in_a", "only_in_b",
            "absent_in_a", "absent_in_b")


def write_plots(out: str | Path, every_param: bool = False) -> list[Path]:
    """Every PNG of the comparison in OUT (plots/): the key data's, and the gradients' where they
    were compared (with `every_param` one per parameter too). `rlprobe compare --plots` and
    pipelines with `report.plots` call this."""
    from rlprobe.report.grad_plots import write_grad_plots

    return write_key_data_plots(out) + write_grad_plots(out, every_param=every_param)


def write_key_data_plots(out: str | Path) -> list[Path]:
    """plots/key_data_heatmap.png and plots/key_data_max_rel_err.png from OUT/key_data.parquet.
    The key x step grids are filled with numpy from Arrow columns (a long run has millions of rows)."""
    from matplotlib.patches import Rectangle

    from rlprobe.report.figures import new_figure, save

    out = Path(out)
    table = pq.read_table(out / "key_data.parquet", columns=["key", "step", "status", "max_rel_err",
                                                             "flow_position", "is_first_divergence"])
    table = table.filter(pc.greater_equal(table["step"], 0))
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    if not table.num_rows:
        return []
    keys, steps, grid, worst, first = key_step_grids(table)
    written = []
    # half an inch a step up to 16 inches (1,000 steps made a 60,000-pixel image); then ~40 labels
    fig, ax = new_figure((min(max(6, 0.5 * len(steps) + 3), 16), min(max(3, 0.4 * len(keys) + 1.5), 12)))
    image = ax.imshow(grid, aspect="auto", cmap="magma_r", vmin=-8, vmax=1, interpolation="nearest")
    ax.set_yticks(range(len(keys)), keys)
    shown = range(0, len(steps), max(1, math.ceil(len(steps) / 40)))
    ax.set_xticks(list(shown), [str(steps[i]) for i in shown], rotation=90 if len(shown) > 20 else 0)
    ax.set_xlabel("step")
    ax.set_title("max relative error per key and step (log10; -8 = identical)")
    for i, j in first:
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="cyan", linewidth=2.5))
    fig.colorbar(image, ax=ax, label="log10 max rel err")
    written.append(save(fig, plots / "key_data_heatmap.png"))

    fig, ax = new_figure((8, 4.5))
    for k, ys in zip(keys, worst):
        if np.any(ys > 0):
            ax.plot(steps, np.maximum(ys, 1e-12), marker="o", label=k)  # NaN (no row) stays a gap
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("max relative error")
    ax.set_title("max relative error by step (keys that differ)")
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small", ncol=2)
    written.append(save(fig, plots / "key_data_max_rel_err.png"))
    return written


def key_step_grids(table: pa.Table) -> tuple[list[str], list[int], np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """From key_data rows (key, step, status, max_rel_err, flow_position, is_first_divergence):
    the keys in flow order, the steps, the heat map grid (key x step: the worst row's log10 max
    relative error, -8 for a match, 1 for an error that is missing or not finite, NaN without a
    row), the largest max_rel_err per cell (0 for rows without one, NaN without a row) and the
    (key, step) cells of the first divergence. Filled with numpy from Arrow columns: a long run
    has millions of rows."""
    order = table.group_by("key").aggregate([("flow_position", "min")]).sort_by(
        [("flow_position_min", "ascending"), ("key", "ascending")])
    keys = order["key"].to_pylist()
    steps = pc.unique(table["step"]).sort().to_pylist()
    row_key = pc.index_in(table["key"], value_set=pa.array(keys, table["key"].type)).to_numpy()
    row_step = pc.index_in(table["step"], value_set=pa.array(steps, table["step"].type)).to_numpy()
    err = table["max_rel_err"].to_numpy()  # nulls read as NaN
    matching = pa.array(["match", "stats_only_match", "close", "stats_only_close", "absent_in_both"])
    match = pc.is_in(table["status"], matching).to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where(match, -8.0, np.where(np.isfinite(err), np.log10(np.maximum(err, 1e-8)), 1.0))
    grid = np.full((len(keys), len(steps)), np.nan)
    np.fmax.at(grid, (row_key, row_step), value)
    worst = np.full((len(keys), len(steps)), np.nan)
    np.fmax.at(worst, (row_key, row_step),
               np.where(table["max_rel_err"].is_null().to_numpy(zero_copy_only=False), 0.0, err))
    marked = np.flatnonzero(pc.fill_null(table["is_first_divergence"], False).to_numpy(zero_copy_only=False))
    return keys, steps, grid, worst, [(int(row_key[i]), int(row_step[i])) for i in marked]
